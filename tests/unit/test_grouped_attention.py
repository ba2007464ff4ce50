"""The hf engine's grouped-query attention (`seedcli.engines.attention`) computes what transformers' `sdpa` computes,
and the continuous batcher's buffered cache (`BufferedLayer`, free columns written in place) gives the tokens the
concatenating DynamicLayer gives: a prefill with left padding, decode steps, requests joining and leaving, and the
buffers filling up and growing many times over."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from seedcli.engines.attention import GROUPED_SDPA, register
from seedcli.engines.batching import ContinuousBatcher
from seedcli.engines.scheduling import ContinuousScheduler

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import tokenizer_texts

    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())


def _models(model_dir):
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    grouped = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=register()
    ).eval()
    assert grouped.config._attn_implementation == GROUPED_SDPA
    assert plain.config.num_attention_heads > plain.config.num_key_value_heads  # the tiny preset groups its heads
    return plain, grouped


def _forward(model, ids, mask, cache):
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)[:, -ids.shape[1] :]
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
    return out.logits, out.past_key_values


def test_grouped_attention_equals_sdpa_on_padded_prefill_and_decode(model_dir):
    plain, grouped = _models(model_dir)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (4, 23), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate([0, 3, 11, 22]):  # left padding of different widths, one row a single token
        mask[row, :pad] = 0
    with torch.inference_mode():
        runs = []
        for model in (plain, grouped):
            m = mask.clone()
            logits, cache = _forward(model, ids, m, DynamicCache(config=model.config))
            steps = [logits[:, -1]]
            for step in range(6):
                m = torch.cat([m, torch.ones_like(m[:, :1])], dim=-1)
                logits, cache = _forward(model, ids[:, step : step + 1], m, cache)
                steps.append(logits[:, -1])
            runs.append((logits, torch.stack(steps)))
        full_plain = plain(input_ids=ids[:, :9]).logits  # no padding, no mask: the causal fallback
        full_grouped = grouped(input_ids=ids[:, :9]).logits
    torch.testing.assert_close(runs[1][1], runs[0][1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(full_grouped, full_plain, rtol=1e-4, atol=1e-4)
    assert float(runs[0][1].std()) > 0.1  # the logits carry signal, not a degenerate constant


def test_grouped_attention_gradients_match(model_dir):
    plain, grouped = _models(model_dir)
    ids = torch.randint(5, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    grads = []
    for model in (plain, grouped):
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits.float().logsumexp(-1)[mask.bool()].sum().backward()
        grads.append(model.model.layers[0].self_attn.k_proj.weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spare", [0, 1, 5, 64])
def test_buffered_cache_gives_the_concatenating_caches_tokens(model_dir, spare):
    """Requests join and leave while the buffers fill and grow (spare 1 and 5 reallocate every few steps); greedy and
    sampled completions equal those of a batcher that concatenates (spare 0, transformers' DynamicLayer)."""
    from seedcli.engines import load_engine

    engine = load_engine("hf", model_dir, device="cpu", max_batch=3)
    prompts = [engine.render([{"role": "user", "content": "Go north. " * (1 + 3 * i)}]) for i in range(7)]

    def serve(spare_columns: int) -> dict:
        batcher = ContinuousBatcher(engine, max_rows=3, prefix_cache_bytes=64 << 20, spare=spare_columns)
        for i, prompt in enumerate(prompts):
            batcher.add(
                i,
                prompt,
                seed=100 + i,
                temperature=0.0 if i % 2 else 1.0,
                max_new_tokens=4 + 5 * (i % 3),
                ban_stop=True,
            )
        out = {}
        while batcher.busy:
            for key, completion in batcher.step():
                out[key] = completion
        return out

    reference = serve(0)
    served = serve(spare)
    assert sorted(served) == list(range(7))
    for i in range(7):
        assert served[i].token_ids == reference[i].token_ids
        assert len(served[i].token_ids) == 4 + 5 * (i % 3)
        assert max(abs(a - b) for a, b in zip(served[i].logprobs, reference[i].logprobs, strict=True)) < 1e-4


def test_engine_uses_grouped_attention_for_text_models(model_dir):
    from seedcli.engines import load_engine

    engine = load_engine("hf", model_dir, device="cpu", max_batch=2)
    assert engine.model.config._attn_implementation == GROUPED_SDPA
    scheduler = ContinuousScheduler(engine)
    layers = scheduler.batcher._buffered(
        DynamicCache(ddp_cache_data=[(torch.zeros(2, 2, 5, 4), torch.ones(2, 2, 5, 4))])
    ).layers
    layer = layers[0]
    assert layer.get_seq_length() == 5 and layer._k.shape[2] == 5 + scheduler.batcher.spare
    k, v = layer.update(torch.full((2, 2, 1, 4), 7.0), torch.full((2, 2, 1, 4), 8.0))
    assert k.shape == (2, 2, 6, 4) and float(k[:, :, -1].min()) == 7.0 and float(v[:, :, :5].max()) == 1.0
    layer.select(torch.tensor([1]), first=2)
    assert layer.keys.shape == (1, 2, 4, 4) and float(layer.keys[0, 0, -1, 0]) == 7.0
