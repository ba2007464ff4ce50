"""Peak memory and time of the naive full log-softmax vs `sequence_logprobs`, side by side in one run.

Each measurement runs in a fresh subprocess and reports the growth of its peak RSS (ru_maxrss) over the
state just before the call, so one variant's allocations never hide another's. The model is a random Qwen2
with Qwen2.5's vocabulary (151,936) and a tiny trunk, so the logits dominate as they do in real re-scoring.

    .venv/bin/python bench/logprob_memory.py            # ~2 minutes on one CPU thread; naive peaks at ~14 GB
    .venv/bin/python bench/logprob_memory.py --batch 4  # smaller
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

VOCAB = 151_936

# mode → (rows, response tokens per row, with backward)
MODES = {
    "rescore": lambda a: (a.batch, a.response, False),
    "rescore-all-tokens": lambda a: (a.batch, a.seq - 1, False),
    "train": lambda a: (a.train_batch, a.response, True),
}


def _build(args: argparse.Namespace, batch: int, response: int):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.seq,
        tie_word_embeddings=False,
    )
    model = transformers.Qwen2ForCausalLM(config).float()
    model.eval()
    input_ids = torch.randint(0, VOCAB, (batch, args.seq))
    attention_mask = torch.ones_like(input_ids)
    response_mask = torch.zeros(batch, args.seq)
    response_mask[:, args.seq - response :] = 1  # prompt first, then the response, as in a turn-sample
    return model, input_ids, attention_mask, response_mask


def _naive(model, input_ids, attention_mask):
    """Every position's log-prob, [B, T − 1]: the same work whatever the response mask."""
    import torch

    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()  # [B, T, V]
    return torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def child(args: argparse.Namespace) -> None:
    """Run one (variant, mode) measurement and print it as JSON."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from seedcli.rl.logprobs import sequence_logprobs

    torch.set_num_threads(args.threads)
    batch, response, grad = MODES[args.mode](args)
    model, input_ids, attention_mask, response_mask = _build(args, batch, response)

    def run():
        if args.variant == "naive":
            return _naive(model, input_ids, attention_mask)
        return sequence_logprobs(model, input_ids, attention_mask, response_mask, chunk_tokens=args.chunk_tokens)

    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if grad:
        logp = run()
        logp.sum().backward()
    else:
        with torch.no_grad():
            logp = run()
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    logp = logp.detach()
    if args.variant == "naive":  # one naive run serves every mode with the same rows and grad
        same_run = [m for m, d in MODES.items() if (d(args)[0], d(args)[2]) == (batch, grad)]
        sums = {m: float(logp[:, -MODES[m](args)[1] :].sum()) for m in same_run}
    else:
        sums = {args.mode: float(logp.sum())}
    print(json.dumps({"peak_mib": (peak_kb - before_kb) / 1024, "seconds": seconds, "sums": sums}))


def _measure(passthrough: list[str], variant: str, mode: str) -> dict:
    """One measurement in a fresh interpreter."""
    cmd = [sys.executable, __file__, *passthrough, "--variant", variant, "--mode", mode]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="rows when re-scoring (no grad)")
    parser.add_argument("--train-batch", type=int, default=2, help="rows with backward (naive needs ~4x more)")
    parser.add_argument("--seq", type=int, default=1024, help="tokens per row")
    parser.add_argument("--response", type=int, default=512, help="response tokens at the end of each row")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--chunk-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variant", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        child(args)
        return

    passthrough = sys.argv[1:]
    print(
        f"vocab {VOCAB}, hidden {args.hidden}, seq {args.seq}, "
        f"chunk_tokens {args.chunk_tokens}, threads {args.threads}; peak = growth of ru_maxrss during the call"
    )
    print(
        f"{'mode':<44}{'naive MiB':>11}{'chunked MiB':>13}{'mem ratio':>11}{'naive s':>9}{'chunked s':>11}{'time ratio':>12}"
    )
    naive_runs: dict[tuple[int, bool], dict] = {}
    for mode, describe in MODES.items():
        batch, response, grad = describe(args)
        if (batch, grad) not in naive_runs:
            naive_runs[batch, grad] = _measure(passthrough, "naive", mode)
        n, c = naive_runs[batch, grad], _measure(passthrough, "chunked", mode)
        diff = abs(n["sums"][mode] - c["sums"][mode]) / max(1.0, abs(n["sums"][mode]))
        label = f"{mode} (B={batch}, {response}/row scored)"
        print(
            f"{label:<44}{n['peak_mib']:>11.0f}{c['peak_mib']:>13.0f}{n['peak_mib'] / max(c['peak_mib'], 1):>10.1f}x"
            f"{n['seconds']:>9.2f}{c['seconds']:>11.2f}{n['seconds'] / c['seconds']:>11.2f}x   (sum rel. diff {diff:.1e})"
        )


if __name__ == "__main__":
    main()
