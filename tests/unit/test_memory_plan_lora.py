"""The memory plan of LoRA training (`seed rl lora=true`) beside full training: the adapter's parameter count against
PEFT's own on a model built in code, the LoRA update phase against a hand computation for Qwen2.5-3B on one GPU, and
`seed rl --print-memory-plan`, whose table shows each card's full and LoRA figures as `plan` computes them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from seedcli.rl.memory_plan import CARDS_GIB, CUDA_OVERHEAD_GIB, GIB, Shape, adapter_params, plan
from tests.helpers_models import tiny_lm
from tests.unit.test_memory_plan_phases import LAYER, P3B, ROOT

ONE_CARD = dict(gpus=1, micro_batch_tokens=16384, gradient_checkpointing=True, vllm_gpu_memory=0.3)


@pytest.mark.parametrize("target", ["all-linear", "q_proj,v_proj", "gate_proj,down_proj"])
def test_the_adapter_count_is_peft_s(target):
    from types import SimpleNamespace

    from seedcli.rl.lora import attach_adapter

    lm = tiny_lm()
    shape = Shape.from_config(lm.config.to_dict())
    cfg = SimpleNamespace(lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target=target, seed=0)
    peft = sum(p.numel() for n, p in attach_adapter(lm, cfg).named_parameters() if ".lora_" in n)
    assert adapter_params(shape, 4, target) == peft


def test_the_3b_lora_update_on_one_card_by_hand():
    s = Shape.load("qwen2.5-3b-shape")
    # r·(in + out): q and o 2048→2048, k and v 2048→256, gate and up 2048→11008, down 11008→2048; 36 layers
    a = 36 * 64 * (2 * 4096 + 2 * 2304 + 3 * 13056)
    assert adapter_params(s, 64) == a == 119_734_272
    lora = plan(s, card_gib=80, lora_r=64, **ONE_CARD)
    # the frozen base in bf16 (2 B) and the adapter's fp32 weights, gradients and AdamW moments (16 B); no reference
    # copy; root + 2 layers (with their adapters) gathered in bf16; one layer's adapter gradient; 3 fp32 logits
    # chunks; checkpointed activations as full training's; no root gradient (frozen); the graph pool; the overhead
    by_hand = (
        2 * P3B + 16 * a + 2 * (ROOT + 2 * (LAYER + a // 36)) + 4 * (a // 36) + 12 * 1024 * 151_936
        + 36 * 16384 * 2 * 2048 + 16384 * 138_240 + 1.0 * GIB + CUDA_OVERHEAD_GIB * GIB
    )  # fmt: skip
    assert lora["phases_gib"]["update (forward+backward)"] == pytest.approx(by_hand / GIB, rel=1e-12)
    full = plan(s, card_gib=80, **ONE_CARD)
    # what LoRA saves at the update: 16 B of fp32 state for every weight but the adapter's, the bf16 reference (less
    # the base's own bf16 copy: the same 2 B), the root's fp32 reduce-scatter buffer and a layer's full fp32 gradient
    saved = 16 * (P3B - a) + 4 * ROOT + 4 * LAYER - 2 * 2 * (a // 36) - 4 * (a // 36)
    assert full["phases_gib"]["update (forward+backward)"] - lora["phases_gib"]["update (forward+backward)"] == (
        pytest.approx(saved / GIB, rel=1e-9)
    )
    assert lora["host_gib"]["start-up: base read in bf16 before the GPU"] == pytest.approx(2 * P3B / GIB)


def test_print_memory_plan_shows_full_and_lora_side_by_side_for_3b_and_7b():
    proc = subprocess.run([sys.executable, "-m", "seedcli", "rl", "--print-memory-plan", "lora_r=64"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for name, preset in (("Qwen2.5-3B", "qwen2.5-3b-shape"), ("Qwen2.5-7B", "qwen2.5-7b-shape")):
        block = text.split(f"{name}: ")[1].split("\n\n")[0]
        assert "LoRA r=64 all-linear" in block
        header, columns = block.splitlines()[2:4]
        assert all(f"{c:.0f} GiB card" in header for c in CARDS_GIB)
        assert columns.split() == ["full", "LoRA"] * len(CARDS_GIB)
        rows = {line[:30].strip(): line[30:].split() for line in block.splitlines()[4:9]}
        for i, card in enumerate(CARDS_GIB):
            full = plan(Shape.load(preset), card_gib=card, **ONE_CARD)
            lora = plan(Shape.load(preset), card_gib=card, lora_r=64, **ONE_CARD)
            for p, cell in ((full, 2 * i), (lora, 2 * i + 1)):
                update = p["phases_gib"]["update (forward+backward)"]
                assert rows["update"][cell].rstrip("!") == f"{update:.1f}"
                assert rows["fits"][cell] == ("yes" if all(p["fits"].values()) else "NO")
