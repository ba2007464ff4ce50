"""Expected per-GPU memory of `seed rl` for a config and a model shape, before launching (see seedcli/rl/memory_plan.py).

    python bench/memory_plan.py                                  # the paper config, Qwen2.5-3B, 8 GPUs, 80 and 141 GiB
    python bench/memory_plan.py --model runs/sft/latest/model --gpus 2 --card 80 --micro-batch-tokens 8192
"""

from __future__ import annotations

import argparse
import json

from seedcli.config import build_config
from seedcli.rl.memory_plan import Shape, format_plan, plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="paper_qwen25_3b", help="rl config preset or YAML file")
    ap.add_argument("--model", default="qwen2.5-3b-shape", help="model directory or a *-shape preset")
    ap.add_argument("--gpus", type=int, default=None, help="default: the config's gpus")
    ap.add_argument("--card", type=float, nargs="+", default=[80.0, 141.0], help="GPU memory in GiB")
    ap.add_argument("--micro-batch-tokens", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()

    cfg = build_config("rl", args.config)
    shape = Shape.load(args.model)
    gpus = args.gpus or cfg.gpus or 1
    mbt = args.micro_batch_tokens or cfg.micro_batch_tokens
    ckpt = cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else True
    out = {}
    for card in args.card:
        p = plan(shape, gpus=gpus, micro_batch_tokens=mbt, gradient_checkpointing=ckpt,
                 vllm_gpu_memory=cfg.vllm_gpu_memory, card_gib=card, kl=cfg.kl_coef > 0)  # fmt: skip
        out[f"{card:.0f}GiB"] = p
        if not args.json:
            print(format_plan(p, f"{args.model} · config {args.config} · micro_batch_tokens {mbt} · "
                                 f"checkpointing {'on' if ckpt else 'off'}"))  # fmt: skip
            print()
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
