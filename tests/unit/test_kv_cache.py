"""The batcher's growing cache layer: the same keys and values a DynamicLayer holds, appended in place while its
buffer has room, and moved into a fresh buffer when the batcher replaces them (splice, trim)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from seedcli.engines.kv_cache import ROOM, growing_layer


def _steps(layer, chunks):
    return [layer.update(k, v) for k, v in chunks]


def test_growing_layer_holds_what_a_dynamic_layer_holds_and_appends_in_place():
    g = torch.Generator().manual_seed(0)
    chunks = [(torch.randn(2, 3, n, 4, generator=g), torch.randn(2, 3, n, 4, generator=g)) for n in [5] + [1] * 20]
    grown, plain = growing_layer()(), DynamicLayer()
    for (gk, gv), (pk, pv) in zip(_steps(grown, chunks), _steps(plain, chunks), strict=True):
        assert torch.equal(gk, pk) and torch.equal(gv, pv)
    assert grown.get_seq_length() == plain.get_seq_length() == 25
    start = grown.keys.data_ptr()
    grown.update(torch.zeros(2, 3, 1, 4), torch.zeros(2, 3, 1, 4))
    assert grown.keys.data_ptr() == start  # no copy: written into the buffer's room


def test_a_replaced_or_full_cache_moves_to_a_fresh_buffer():
    layer = growing_layer()()
    layer.update(torch.ones(2, 1, 3, 2), torch.ones(2, 1, 3, 2))
    # the batcher drops a row and trims a column: keys and values become other tensors
    layer.keys, layer.values = layer.keys[:1, :, 1:].clone(), layer.values[:1, :, 1:].clone()
    keys, _ = layer.update(torch.full((1, 1, 1, 2), 7.0), torch.full((1, 1, 1, 2), 7.0))
    assert keys.shape == (1, 1, 3, 2) and keys[0, 0, :, 0].tolist() == [1.0, 1.0, 7.0]
    for _ in range(ROOM + 1):  # past the room: a bigger buffer, the contents kept
        keys, _ = layer.update(torch.full((1, 1, 1, 2), 3.0), torch.full((1, 1, 1, 2), 3.0))
    assert keys.shape[2] == 3 + ROOM + 1 and keys[0, 0, :3, 0].tolist() == [1.0, 1.0, 7.0]
    assert bool((keys[0, 0, 3:] == 3.0).all())
