"""LoRA in `seed rl` (rl/lora.py) on a random two-layer Qwen2 in fp32, in process: only the adapter trains; the merged
view the engine gets is W + (α/r)·B·A and computes what the adapter forward computes; the KL reference (the adapter
switched off) is the base model bit for bit; the refresh proof compares the merged weights, so an engine left with the
stale adapter fails it, and so does one that cannot show them; the checkpoint's adapter/ loads back exactly; the
config hash of a run without LoRA is what it was."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from seedcli.config import RLConfig
from seedcli.errors import UserError
from seedcli.rl.distributed import DistInfo
from seedcli.rl.logprobs import Scorer
from seedcli.rl.lora import (
    AdapterOff,
    adapter_state,
    attach_adapter,
    merge_weight,
    merged_names,
    merged_params,
    proof_names,
    save_adapter,
)
from seedcli.rl.weight_sync import WeightSync, WeightSyncError, checksum_names, trainer_checksums
from tests.helpers_models import tiny_lm

ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_cfg(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "lora_target": "all-linear",
                              "seed": 0, **kw})  # fmt: skip


def trained_adapter(lm, seed: int = 1, scale: float = 0.05) -> None:
    """B (zero when fresh) and A set to random values, as updates would move them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def test_only_the_adapter_trains_and_a_fresh_one_merges_to_the_base_bit_for_bit():
    base = tiny_lm()
    start = {k: v.clone() for k, v in base.state_dict().items()}
    lm = attach_adapter(base, lora_cfg())
    trainable = [n for n, p in lm.named_parameters() if p.requires_grad]
    # all-linear: the seven linear modules of each of the two layers, A and B each; lm_head is left out
    assert len(trainable) == 2 * len(ADAPTED) * 2 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert not [n for n, p in lm.named_parameters() if p.requires_grad and "lm_head" in n]
    merged = dict(merged_params(lm))
    assert merged.keys() == start.keys()
    assert all(torch.equal(merged[k], start[k]) for k in start)  # B starts at 0: the merged model is the base
    # the adapter's draw depends on the seed alone, not on what used the global generator before it
    torch.manual_seed(123)
    again = attach_adapter(tiny_lm(), lora_cfg())
    a = {k: v for k, v in lm.state_dict().items() if ".lora_A." in k}
    assert a and all(torch.equal(v, again.state_dict()[k]) for k, v in a.items())


def test_the_merged_view_is_base_plus_scaled_product_and_computes_what_the_adapter_computes():
    base = tiny_lm()
    start = {k: v.clone() for k, v in base.state_dict().items()}
    lm = attach_adapter(base, lora_cfg())
    trained_adapter(lm)
    merged = dict(merged_params(lm))
    changed = set(merged_names(lm))
    assert len(changed) == 2 * len(ADAPTED)
    for name, tensor in merged.items():
        if name not in changed:
            assert torch.equal(tensor, start[name]), name  # embeddings, norms, biases: the base's bits
            continue
        module = name.removesuffix(".weight")
        sd = lm.state_dict()
        a, b = (sd[f"base_model.model.{module}.lora_{x}.default.weight"] for x in "AB")
        assert torch.equal(tensor, merge_weight(start[name], a, b, 8 / 4))
        assert (tensor - start[name]).abs().max() > 1e-3  # the adapter moved it
    plain = tiny_lm()
    plain.load_state_dict(merged)
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = lm.eval()(ids).logits, plain(ids).logits
    assert (want - got).abs().max() < 1e-5  # float rounding of the factored vs the merged matmul
    assert (want - tiny_lm()(ids).logits).abs().max() > 1e-2  # ... while the adapter changed the output


def test_the_kl_reference_is_the_base_model_bit_for_bit_and_leaves_the_adapter_trainable():
    base_copy = tiny_lm()
    lm = attach_adapter(tiny_lm(), lora_cfg())
    trained_adapter(lm)
    scorer = Scorer(lm)
    ref = AdapterOff(scorer)
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    attn, resp = torch.ones_like(ids), torch.zeros(ids.shape)
    resp[:, 4:] = 1
    with torch.no_grad():
        off = ref(ids, attn, resp)
        on = scorer(ids, attn, resp)
        plain = Scorer(base_copy)(ids, attn, resp)
    assert torch.equal(off, plain)  # the base's own computation: no second copy of the model needed
    assert (on - off).abs().max() > 1e-3  # the actor with its adapter is another policy
    assert all(p.requires_grad for n, p in lm.named_parameters() if ".lora_" in n)
    with torch.no_grad():
        assert torch.equal(scorer(ids, attn, resp), on)  # the adapter is back on after the reference pass


class CopyEngine:
    """An engine with its own copy of the merged weights (the hf engine's interface); `load=False` keeps the copy
    it started with, as an engine whose refresh never landed; `linear=False` cannot show linear weights."""

    def __init__(self, lm, load: bool = True, linear: bool = True):
        self.state = {k: v.clone() for k, v in merged_params(lm)}
        self.load, self.linear = load, linear

    def update_weights(self, weights):
        if self.load:
            self.state.update({k: v.clone() for k, v in weights.items()})

    def weight_checksums(self, names):
        shown = [n for n in names if self.linear or "_proj.weight" not in n]
        return trainer_checksums(self.state.items(), shown, torch.float32)


def lora_sync(lm, engine) -> WeightSync:
    required = proof_names(lm)
    names = [*checksum_names(lm.config.num_hidden_layers, linear=False), *required]
    return WeightSync(engine, lm, DistInfo(), shared=False, checksum_names=names, params=merged_params,
                      required=required, check_sync=lambda step: {})  # fmt: skip


def adapter_step(lm) -> None:
    """One AdamW step on the adapter alone, at the paper's lr: B leaves 0, every merged weight it feeds moves."""
    opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-6)
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(5))
    lm.train()(ids, labels=ids).loss.backward()
    opt.step()


def test_the_refresh_proof_covers_the_adapter_and_a_stale_one_fails_it():
    lm = attach_adapter(tiny_lm(), lora_cfg())
    fresh, stale, blind = CopyEngine(lm), CopyEngine(lm, load=False), CopyEngine(lm, linear=False)
    for engine in (fresh, stale):
        lora_sync(lm, engine).prove_start(0)  # both hold the starting (merged = base) weights
    # an engine that cannot show the adapted weights cannot prove a refresh: it fails before the first update
    with pytest.raises(WeightSyncError, match="update 0: .*does not show its merged LoRA weights"):
        lora_sync(lm, blind).prove_start(0)
    adapter_step(lm)
    sync = lora_sync(lm, fresh).refresh(1)
    # the first and last layer's seven adapted weights, beside the embedding, the norms and the q/v biases
    assert sync["sync/checksum_lora_tensors"] == 14 and sync["sync/checksum_tensors"] == 14 + 6
    with pytest.raises(WeightSyncError, match=r"update 1: .*q_proj\.weight.* differ .*stale weights"):
        lora_sync(lm, stale).refresh(1)
    with pytest.raises(WeightSyncError, match="update 1: .*does not show its merged LoRA weights"):
        lora_sync(lm, blind).refresh(1)  # ... nor after one: never skipped silently


def test_the_saved_adapter_loads_back_exactly(tmp_path):
    lm = attach_adapter(tiny_lm(), lora_cfg())
    trained_adapter(lm)
    save_adapter(lm, adapter_state(lm), tmp_path / "adapter")
    files = sorted(p.name for p in (tmp_path / "adapter").iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors"]
    back = attach_adapter(tiny_lm(), lora_cfg(), tmp_path / "adapter")
    want, got = adapter_state(lm), adapter_state(back)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    with pytest.raises(UserError, match="does not fit"):
        attach_adapter(tiny_lm(), lora_cfg(lora_target="q_proj"), tmp_path / "adapter")


def test_lora_settings_are_checked_and_hashed_only_with_lora():
    plain = RLConfig()
    assert RLConfig(lora_r=64, lora_target="q_proj,v_proj").config_hash() == plain.config_hash()
    on = RLConfig(lora=True)
    assert on.config_hash() != plain.config_hash()
    assert RLConfig(lora=True, lora_r=64).config_hash() != on.config_hash()
    assert RLConfig(lora_target=" q_proj , v_proj").lora_target == "q_proj,v_proj"
    with pytest.raises(ValueError, match="lm_head and embed_tokens stay frozen"):
        RLConfig(lora=True, lora_target="q_proj,lm_head")
    with pytest.raises(UserError, match="lora_target nope_proj"):
        attach_adapter(tiny_lm(), lora_cfg(lora_target="nope_proj"))
