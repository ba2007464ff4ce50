"""The continuous batcher's key/value cache: transformers' DynamicCache whose layers append into spare room.

A DynamicLayer concatenates at every decode step, so each step copies the whole cache (SmolLM2, 16 rows of 500
tokens: 360 MB a step, a tenth of a decode step's time on two cores). A `GrowingLayer` keeps a buffer with room for
`ROOM` more tokens and writes a step's keys and values into it; its `keys` and `values` are views of the filled part,
so code that reads or replaces them (the batcher's splice and trim) works unchanged; a replaced tensor moves into a
fresh buffer at the next append.

    cache = new_cache(model.config)                       # empty
    cache = new_cache(model.config, [(k, v), ...])        # filled: per layer keys/values [B, H, n, D]
"""

from __future__ import annotations

import functools
from typing import Any

ROOM = 128  # tokens of spare room a buffer gets when it is (re)allocated


@functools.cache
def growing_layer() -> type:
    """The GrowingLayer class (built on first use: importing seedcli.engines loads no transformers)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A DynamicLayer that appends in place while its buffer has room (see the module docstring)."""

        def __init__(self) -> None:
            super().__init__()
            self._kbuf: Any = None
            self._vbuf: Any = None

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = self.keys.shape[-2] if self.keys.dim() == 4 else 0
            k = key_states.shape[-2]
            if not self._in_buffer(n, k, key_states):
                self._kbuf = _grow(self.keys, n, key_states, k)
                self._vbuf = _grow(self.values, n, value_states, k)
            self._kbuf[:, :, n : n + k] = key_states
            self._vbuf[:, :, n : n + k] = value_states
            self.keys = self._kbuf[:, :, : n + k]
            self.values = self._vbuf[:, :, : n + k]
            return self.keys, self.values

        def _in_buffer(self, n: int, k: int, new: Any) -> bool:
            """Whether `keys` is still the filled part of this layer's buffer, with room for `k` more tokens."""
            buf = self._kbuf
            if buf is None or n == 0 or n + k > buf.shape[2] or buf.shape[:2] != new.shape[:2]:
                return False
            return (
                self.keys.data_ptr() == buf.data_ptr()
                and self.values.data_ptr() == self._vbuf.data_ptr()
                and self.keys.shape[2] == n
                and self.keys.stride() == buf.stride()
            )

    return GrowingLayer


def _grow(old: Any, n: int, new: Any, k: int) -> Any:
    """A buffer for n + k tokens and ROOM more, holding `old`'s n."""
    buf = new.new_empty((new.shape[0], new.shape[1], n + k + ROOM, new.shape[3]))
    if n:
        buf[:, :, :n] = old
    return buf


def new_cache(config: Any, layers: list[tuple[Any, Any]] | None = None) -> Any:
    """A DynamicCache for `config`'s model whose full-attention layers are GrowingLayers, filled with `layers` when
    given."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    # a sliding-window layer keeps its own kind (it drops what falls out of the window)
    cache.layers = [growing_layer()() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    for layer, (keys, values) in zip(cache.layers, layers or [], strict=False):
        layer.update(keys, values)
    return cache
