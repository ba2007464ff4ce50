"""Grouped-query attention for the hf engine's padded decoding, without repeating the key/value heads.

transformers' `sdpa` attention repeats every key/value head for the query heads that share it (`repeat_kv`) whenever
an attention mask is given, and a left-padded batch always gives one. SmolLM2-135M has 9 query heads on 3 key/value
heads, so each decode step copied the whole cache three times over before attending: measured on one AVX2 thread,
64 rows at ~600 cached tokens, 45% of an eval's time went to `repeat_kv` and 19% to attending over the copies.

Here the query heads that share a key/value head are folded into the query-length axis instead,

    q [B, H, L, D] -> [B, H_kv, G*L, D]      (head h = kv * G + g uses key/value head kv, as repeat_kv orders them)
    mask [B, 1, L, S] -> [B, 1, G*L, S]      (row g*L + l is query l's)

so one `scaled_dot_product_attention` reads each cached key and value once. It is the same arithmetic (up to float
summation order: ~5e-5 on SmolLM2's logits). Cases it does not cover go to transformers' own function: no grouping,
a causal prefill without a mask (SDPA then groups itself), dropout, position biases, paged caches.

    name = register()                        # idempotent; the name for `attn_implementation=`
    AutoModelForCausalLM.from_pretrained(dir, attn_implementation=name)
"""

from __future__ import annotations

from typing import Any

GROUPED_SDPA = "seed_grouped_sdpa"


def grouped_sdpa_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """An `AttentionInterface` function: query [B, H, L, D], key/value [B, H_kv, S, D], a boolean or additive mask
    [B, 1, L, S] or None → ([B, L, H, D], None)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    plain = (
        groups == 1
        or heads != groups * kv_heads
        or (attention_mask is None and length > 1)
        or dropout
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
        or kwargs.get("output_attentions")
    )
    if plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    folded = query.reshape(batch, kv_heads, groups * length, dim)
    mask = attention_mask
    if mask is not None:
        mask = mask.expand(batch, 1, length, mask.shape[-1]).repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return out.view(batch, heads, length, dim).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the grouped attention (and sdpa's mask builder under its name) with transformers; returns its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    return GROUPED_SDPA
