"""Expected per-GPU memory of `seed rl` for a config and a model shape, before launching (see seedcli/rl/memory_plan.py).

python bench/memory_plan.py       # the paper's configs on 8 GPUs, 80 and 141 GiB: ALFWorld with Qwen2.5-3B and
                                  # visual Sokoban with Qwen2.5-VL-3B (96×96 rooms, one image a turn)
python bench/memory_plan.py --config sokoban/paper_qwen25vl_3b --model qwen2.5-vl-3b-shape --card 80
python bench/memory_plan.py --config ezpoints/paper_qwen25vl_3b --model qwen2.5-vl-3b-shape --image 300 300
python bench/memory_plan.py --model runs/sft/latest/model --gpus 2 --card 80 --micro-batch-tokens 8192
python bench/memory_plan.py --vllm-graph-gib 0.4  # the size vLLM logged ("Graph capturing finished ..., took X GiB")

Per GPU by component and by phase (start-up, rollout, re-scoring, update), and host memory per rank.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from seedcli.config import build_config
from seedcli.rl.memory_plan import VLLM_GRAPH_POOL_GIB, Shape, format_plan, image_patches, plan

# (rl config, model) printed when neither --config nor --model is given
PAPER_ROWS = (("paper_qwen25_3b", "qwen2.5-3b-shape"), ("sokoban/paper_qwen25vl_3b", "qwen2.5-vl-3b-shape"))


def pixel_bounds(model: str) -> tuple[int, int]:
    """The image processor's (min_pixels, max_pixels): a model directory's preprocessor_config.json, else the
    preset's (tiny-vl's small bounds, or Qwen2.5-VL-Instruct's own)."""
    from seedcli.engines import vision

    path = Path(model) / "preprocessor_config.json"
    if path.is_file():
        pre = json.loads(path.read_text())
        size = pre.get("size") or {}
        return int(pre.get("min_pixels") or size["shortest_edge"]), int(pre.get("max_pixels") or size["longest_edge"])
    if model == "tiny-vl":
        return vision.TINY_MIN_PIXELS, vision.TINY_MAX_PIXELS
    return vision.QWEN25_VL_MIN_PIXELS, vision.QWEN25_VL_MAX_PIXELS


def vision_load(cfg, shape: Shape, model: str, gpus: int, image: list[int], images_per_turn: int) -> tuple[int, int]:
    """(images per micro-batch, patches per image) of an image-observation config on a VLM, else (0, 0).

    A rank trains on its share of each mini-batch, ceil(mini_batch / gpus) turn-samples, packed into micro-batches:
    at most that many turns' images go through the tower at once. Re-scoring packs more turns per micro-batch, but
    without grad the tower holds one block's intermediates at a time (tens of MiB)."""
    if shape.vision is None or (cfg.env_options or {}).get("observation") != "image":
        return 0, 0
    low, high = pixel_bounds(model)
    v = shape.vision
    patches = image_patches(image[0], image[1], min_pixels=low, max_pixels=high, patch=v.patch, merge=v.merge)
    return math.ceil(cfg.mini_batch / gpus) * images_per_turn, patches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None, help="rl config preset or YAML file (default: the paper's, see above)")
    ap.add_argument(
        "--model", default=None, help="model directory or a *-shape preset (default: the config's paper model)"
    )
    ap.add_argument("--gpus", type=int, default=None, help="default: the config's gpus")
    ap.add_argument("--card", type=float, nargs="+", default=[80.0, 141.0], help="GPU memory in GiB")
    ap.add_argument("--micro-batch-tokens", type=int, default=None)
    ap.add_argument("--checkpointing", choices=["on", "off"], default=None, help="default: the config's")
    ap.add_argument("--image", type=int, nargs=2, default=[96, 96], metavar=("H", "W"),
                    help="image observation size (Sokoban's 6×6 room: 96 96; EZPoints' canvas: 300 300)")  # fmt: skip
    ap.add_argument("--images-per-turn", type=int, default=1, help="images in a turn's prompt (the visual prompts: 1)")
    ap.add_argument("--vllm-graph-gib", type=float, default=None,
                    help=f"vLLM's CUDA-graph pool, resident while it sleeps (default: {VLLM_GRAPH_POOL_GIB}, an upper "
                    "bound for ≤7B; see memory_plan.VLLM_GRAPH_POOL_GIB)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()

    if args.config is None and args.model is None:
        rows = list(PAPER_ROWS)
    else:
        rows = [(args.config or "paper_qwen25_3b", args.model or "qwen2.5-3b-shape")]
    out = {}
    for config, model in rows:
        cfg = build_config("rl", config)
        shape = Shape.load(model)
        gpus = args.gpus or cfg.gpus or 1
        mbt = args.micro_batch_tokens or cfg.micro_batch_tokens
        ckpt = cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else True
        if args.checkpointing:
            ckpt = args.checkpointing == "on"
        images, patches = vision_load(cfg, shape, model, gpus, args.image, args.images_per_turn)
        seen = f" · {images} images × {patches} patches a micro-batch" if images else ""
        for card in args.card:
            p = plan(shape, gpus=gpus, micro_batch_tokens=mbt, gradient_checkpointing=ckpt,
                     vllm_gpu_memory=cfg.vllm_gpu_memory, card_gib=card, kl=cfg.kl_coef > 0,
                     images_per_micro_batch=images, patches_per_image=patches, vllm_graph_gib=args.vllm_graph_gib,
                     vllm_sleep_level=cfg.vllm_sleep_level)  # fmt: skip
            out[f"{model} · {config} · {card:.0f}GiB"] = p
            if not args.json:
                print(format_plan(p, f"{model} · config {config} · micro_batch_tokens {mbt}{seen} · "
                                     f"checkpointing {'on' if ckpt else 'off'}"))  # fmt: skip
                print()
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
