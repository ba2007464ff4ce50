"""The memory plan's start-up phase, the root gradient's reduce-scatter buffer, vLLM's CUDA-graph pool (resident
while it sleeps) and host memory per rank, against hand computations for Qwen2.5-3B's shape."""

from __future__ import annotations

import pytest

from seedcli.rl.memory_plan import (
    CUDA_OVERHEAD_GIB,
    GIB,
    HOST_PROCESS_GIB,
    VLLM_GRAPH_POOL_GIB,
    Shape,
    format_plan,
    host_plan,
    plan,
)

P3B = 3_085_938_688  # Qwen2.5-3B-Instruct: 36 layers of 77,076,992 + the tied embedding 151,936·2048 + final norm
ROOT = 151_936 * 2048 + 2048
LAYER = 77_076_992
PAPER = dict(gpus=8, micro_batch_tokens=16384, gradient_checkpointing=True, vllm_gpu_memory=0.3, card_gib=80)


def paper_plan(**kw) -> dict:
    return plan(Shape.load("qwen2.5-3b-shape"), **{**PAPER, **kw})


def test_the_3b_counts():
    s = Shape.load("qwen2.5-3b-shape")
    assert (s.params, s.root_params, s.layer_params) == (P3B, ROOT, LAYER) and s.tied


def test_the_update_adds_the_root_reduce_scatter_buffer_and_the_graph_pool():
    p = paper_plan()
    assert p["components_gib"]["root gradient reduce-scatter buffer (fp32)"] == pytest.approx(4 * ROOT / GIB)
    assert p["components_gib"]["vLLM CUDA-graph pool (resident in sleep)"] == VLLM_GRAPH_POOL_GIB == 1.0
    # fp32 master + grads + AdamW (16 B) and bf16 reference (2 B) over 8 ranks; root + 2 layers gathered in bf16; a
    # layer's fp32 gradient; 3 fp32 logits chunks of 1024 × 151,936; checkpointed activations (each layer's bf16
    # input, one layer's intermediates of 138,240 B a token); the root's fp32 reduce-scatter buffer; the graph pool
    by_hand = (
        18 * P3B / 8 + 2 * (ROOT + 2 * LAYER) + 4 * LAYER + 12 * 1024 * 151_936
        + 36 * 16384 * 2 * 2048 + 16384 * 138_240
        + 4 * ROOT + 1.0 * GIB + CUDA_OVERHEAD_GIB * GIB
    )  # fmt: skip
    assert p["phases_gib"]["update (forward+backward)"] == pytest.approx(by_hand / GIB, rel=1e-12)
    assert 17.8 < by_hand / GIB < 18.0  # was 15.72 without the two


def test_the_graph_pool_stays_beside_the_trainer_but_not_beside_the_awake_engine():
    with_pool, without = paper_plan(vllm_graph_gib=1.5), paper_plan(vllm_graph_gib=0.0)
    diff = {k: with_pool["phases_gib"][k] - without["phases_gib"][k] for k in with_pool["phases_gib"]}
    assert diff["re-scoring (no grad)"] == pytest.approx(1.5)
    assert diff["update (forward+backward)"] == pytest.approx(1.5)
    # awake, the pool is inside vLLM's gpu_memory_utilization share
    assert diff["rollout (vLLM awake)"] == 0.0 and diff["start-up (full fp32 actor + vLLM)"] == 0.0
    # no vLLM share (the hf engine): no graph pool either
    hf = paper_plan(vllm_gpu_memory=0.0)
    assert hf["vllm_graph_pool_gib"] == 0.0 and hf["components_gib"]["vLLM CUDA-graph pool (resident in sleep)"] == 0


@pytest.mark.parametrize(
    ("gpus", "kl", "actor_and_ref"),
    [
        (8, True, 4 * P3B),  # the full fp32 actor outweighs the sharded one (4P/8) + the full bf16 reference
        (1, True, 6 * P3B),  # one rank: the "sharded" actor is whole, so the full reference comes on top
        (1, False, 4 * P3B),  # no KL term: no reference
        (2, True, 4 * P3B),  # 4P/2 + 2P = 4P
    ],
)
def test_start_up_holds_the_full_fp32_actor_beside_vllms_share(gpus, kl, actor_and_ref):
    p = paper_plan(gpus=gpus, kl=kl)
    by_hand = 0.3 * 80 * GIB + actor_and_ref + CUDA_OVERHEAD_GIB * GIB
    assert p["phases_gib"]["start-up (full fp32 actor + vLLM)"] == pytest.approx(by_hand / GIB, rel=1e-12)
    assert p["fits"]["start-up (full fp32 actor + vLLM)"]


def test_start_up_is_the_phase_that_does_not_fit_a_small_card():
    # 7B untied on 8 × 80 GB with a 0.6 vLLM share: 48 GiB + the full fp32 actor (4 · 7.62B = 28.4 GiB) + 2 GiB
    # overhead > 0.95 · 80, while every later phase fits (the sharded update: 35 GiB)
    s = Shape.load("qwen2.5-7b-shape")
    p = plan(s, gpus=8, micro_batch_tokens=16384, gradient_checkpointing=True, vllm_gpu_memory=0.6, card_gib=80)
    assert p["phases_gib"]["start-up (full fp32 actor + vLLM)"] == pytest.approx(48 + 4 * s.params / GIB + 2)
    assert [k for k, ok in p["fits"].items() if not ok] == ["start-up (full fp32 actor + vLLM)"]


def test_host_memory_per_rank_by_hand():
    h = host_plan(Shape.load("qwen2.5-3b-shape"))
    assert h["start-up: actor read in fp32 before the GPU"] == pytest.approx(4 * P3B / GIB)  # 11.50 GiB
    assert h["vLLM asleep (level 2): its weight backup"] == 0.0  # level 2 drops the weights
    assert h["checkpoint, rank 0: the model gathered"] == pytest.approx(2 * P3B / GIB)  # bf16
    assert h["peak per rank"] == pytest.approx(4 * P3B / GIB + HOST_PROCESS_GIB)
    level1 = host_plan(Shape.load("qwen2.5-3b-shape"), vllm_sleep_level=1)
    assert level1["vLLM asleep (level 1): its weight backup"] == pytest.approx(2 * P3B / GIB)  # pinned bf16 copy
    assert paper_plan(vllm_sleep_level=1)["host_gib"] == level1


def test_format_plan_prints_the_new_lines():
    text = format_plan(paper_plan(), "paper")
    for line in ("root gradient reduce-scatter buffer (fp32)", "vLLM CUDA-graph pool (resident in sleep)",
                 "start-up (full fp32 actor + vLLM)", "host memory per rank", "peak per rank",
                 "(8 ranks on one node, at start-up)"):  # fmt: skip
        assert line in text, line
    assert f"{(4 * P3B / GIB + HOST_PROCESS_GIB) * 8:.2f}" in text
