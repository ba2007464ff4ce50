"""Continuous batching for the hf engine: requests join and leave the running batch at every decode step.

    batcher = engine.batcher()
    batcher.add("ep3/t2", prompt_ids, seed=1234, temperature=1.0, top_p=1.0, max_new_tokens=512)
    while batcher.busy:
        for key, completion in batcher.step():   # one decode iteration for every running request
            ...

`HFEngine.generate` decodes a batch until its longest completion is done (a short reply waits for a long one); here a
finished request leaves at once and a waiting one takes its row at the next step (`rollout: async`). A request's
completion depends on its prompt and seed alone: it draws from its own generator exactly as `RowSampler` does in
`generate` (the same exponential race, the same number of draws a step), so the two paths give the same tokens.

The batch keeps one key/value cache, left-padded: a joining request is prefilled on its own rows and spliced in
(the shorter side padded on the left, masked); a leaving request's rows are dropped, and columns that are padding
for every row are trimmed. With a prefix store (`prefix_cache.py`, the engine's `prefix_cache_mb`) a joining prompt
prefills only what follows its longest stored prefix: the stored states sit before its tail in the same row, the gap
between them masked. Text models only: a vision-language model's M-RoPE offsets are per prefill, so the rollout
sends its requests to `generate` as they become ready instead.

The running cache keeps `spare` free columns on the right of every layer (`BufferedLayer`): a decode step writes its
key and value there in place, where transformers' DynamicLayer concatenates, a copy of the whole cache every step
(19% of an eval's time on one CPU thread at 64 rows; `bench/hf_decode.py`). `spare=0` is the DynamicLayer behaviour.

A finished request leaves a hole (`holes=True`): its row stays in the cache, decoding a pad token nobody reads, until a
joining request is prefilled and copied into that row alone. Dropping the row at once and splicing the newcomer in
copied every row's cache twice a turn, once when a request left and once when the next joined: on two AVX2 cores at 64
rows ~45% of an evaluation's time (`bench/hf_holes.py`). When a quarter of the rows are holes and nobody waits (the end
of a run) the batch is compacted; `holes=False` compacts at every finish, the earlier behaviour.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from seedcli.engines.base import Completion, completion_text
from seedcli.engines.prefix_cache import PrefixStore, shared_prefixes

SPARE_COLUMNS = 64  # free cache columns kept on the right: one reallocation every 64 decode steps
HOLE_FRACTION = 0.25  # holes kept at most, as a share of the rows, while nobody waits to fill them


@dataclass
class _Row:
    key: Any
    prompt: list[int]
    generator: Any  # torch.Generator (temperature > 0)
    temperature: float
    top_p: float
    max_new_tokens: int
    ban_stop: bool = False  # the rollout bench forces a length: the stop tokens are never drawn
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class ContinuousBatcher:
    """At most `max_rows` requests decode together; the rest wait in arrival order. Each request has its own sampling
    settings (a rollout turn samples, an analysis is greedy). `steps` counts decode iterations (a step decodes one
    token for every running request), the hardware-independent cost of a rollout."""

    def __init__(
        self,
        engine: Any,
        *,
        max_rows: int,
        prefix_cache_bytes: int = 0,
        spare: int = SPARE_COLUMNS,
        holes: bool = True,
    ):
        if engine.vision:
            raise ValueError("continuous batching is for text models; a vision-language model uses generate")
        self.engine = engine
        self.max_rows = max_rows
        self.spare = spare  # free columns the running cache keeps for decode steps (0: concatenate each step)
        self.holes = holes  # a finished request's row waits for the next joining one (False: dropped at once)
        self.copies = 0  # whole-batch cache copies made to drop or add rows (one per compaction or splice)
        # prompts' key/value states for reuse (seedcli.engines.prefix_cache); off for models whose cache is not
        # plain full attention (a sliding window drops what a stored prefix would need)
        self.store = PrefixStore(prefix_cache_bytes) if prefix_cache_bytes > 0 and _plain_cache(engine) else None
        self.weights_version = getattr(engine, "weights_version", 0)
        self.prompt_tokens = 0  # prompt tokens admitted
        self.prefill_tokens = 0  # of them, those run through a forward (the rest came from the prefix cache)
        self.waiting: list[_Row] = []
        self.rows: list[_Row | None] = []  # None: a hole, a finished request's row that no request holds yet
        self.cache: Any = None
        self.mask: Any = None  # [rows, columns] 1 at real tokens
        self.logits: Any = None  # [rows, V] next-token logits of each running row
        self.steps = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self._live())

    def _live(self) -> list[int]:
        """Indices of the rows that hold a request."""
        return [i for i, row in enumerate(self.rows) if row is not None]

    def add(
        self,
        key: Any,
        prompt: list[int],
        seed: int,
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        ban_stop: bool = False,
    ) -> None:
        """Queue a request; it joins the batch at the next `step` when a row is free."""
        import torch

        if not prompt:
            raise ValueError("a request needs a non-empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        generator = None
        if temperature > 0:
            generator = torch.Generator(device=self.engine.device).manual_seed(int(seed))
        self.waiting.append(_Row(key, list(prompt), generator, temperature, top_p, max_new_tokens, ban_stop))

    def step(self) -> list[tuple[Any, Completion]]:
        """Admit waiting requests into free rows, draw one token for every running request, and return the
        requests that finished (stop token drawn or their length reached), in row order."""
        import torch

        with torch.inference_mode():
            self._admit()
            if not self._live():
                self._keep([])
                return []
            self.steps += 1
            tokens = self._draw()
            done: list[tuple[Any, Completion]] = []
            for i, (row, token) in enumerate(zip(self.rows, tokens, strict=True)):
                if row is None:
                    continue
                row.tokens.append(token)
                if token in self.engine.stop_ids and not row.ban_stop:
                    done.append((row.key, self._completion(row, "stop")))
                elif len(row.tokens) >= row.max_new_tokens:
                    done.append((row.key, self._completion(row, "length")))
                else:
                    continue
                self.rows[i] = None
            live = self._live()
            holes = len(self.rows) - len(live)
            if not self.holes or not live or holes > HOLE_FRACTION * len(self.rows):
                self._keep(live)
            if self.rows:
                self._decode([self.engine.pad_id if row is None else row.tokens[-1] for row in self.rows])
            return done

    # ------------------------------------------------------------------------------------------------ internals

    def _completion(self, row: _Row, finish: str) -> Completion:
        return Completion(
            text=completion_text(self.engine.tokenizer, row.tokens, self.engine.stop_ids),
            token_ids=list(row.tokens),
            logprobs=list(row.logprobs),
            finish_reason=finish,
        )

    def _draw(self) -> list[int]:
        """One token per running row from its logits: its own exponential race (temperature > 0) or the argmax;
        the log-prob is the raw logits' (before temperature and top-p), as `generate` reports it."""
        import torch

        logits = self.logits.float()
        scores = logits
        if any(row is not None and row.ban_stop for row in self.rows):
            scores = logits.clone()
            for i, row in enumerate(self.rows):
                if row is not None and row.ban_stop:
                    scores[i, self.engine.stop_ids] = float("-inf")
        choice = scores.argmax(dim=-1)  # greedy rows keep it; sampled rows race, each group of settings at once
        groups: dict[tuple[float, float], list[int]] = {}
        for i, row in enumerate(self.rows):
            if row is not None and row.temperature > 0:
                groups.setdefault((row.temperature, row.top_p), []).append(i)
        for (temperature, top_p), members in groups.items():
            index = torch.tensor(members, device=scores.device)
            drawn = race_choice(scores[index], [self.rows[i].generator for i in members], temperature, top_p)
            choice[index] = drawn
        logp = torch.log_softmax(logits, dim=-1).gather(-1, choice.unsqueeze(-1)).squeeze(-1)
        for row, value in zip(self.rows, logp.tolist(), strict=True):
            if row is not None:
                row.logprobs.append(value)
        return choice.tolist()

    def _admit(self) -> None:
        holes = [i for i, row in enumerate(self.rows) if row is None]
        free = len(holes) + self.max_rows - len(self.rows)
        if free <= 0 or not self.waiting:
            return
        joining, self.waiting = self.waiting[:free], self.waiting[free:]
        cache, mask, logits = self._prefill([row.prompt for row in joining])
        wider = bool(self.rows) and mask.shape[1] > self.mask.shape[1]
        if wider:  # a prompt wider than the running rows: drop the holes, then one splice for all newcomers
            self._keep(self._live())
        if not self.rows:
            self.cache, self.mask, self.logits, self.rows = self._buffered(cache), mask, logits, joining
            return
        if wider:
            self._splice(cache, mask, logits, joining)
            return
        filled = min(len(holes), len(joining))

        def layers(part: slice) -> list[Any]:  # the prefill cache's rows `part`, as `_fill` and `_splice` read them
            return [SimpleNamespace(keys=layer.keys[part], values=layer.values[part]) for layer in cache.layers]

        if filled:
            into = slice(0, filled)
            self._fill(holes[:filled], layers(into), mask[into], logits[into], joining[into])
        if filled < len(joining):
            rest = slice(filled, None)
            self._splice(SimpleNamespace(layers=layers(rest)), mask[rest], logits[rest], joining[rest])

    def _fill(self, holes: list[int], layers: list[Any], mask: Any, logits: Any, joining: list[_Row]) -> None:
        """Prefilled newcomers into holes, row by row: newcomer j's cache columns (`layers`' keys and values; at most
        as many as the running rows') on the right of hole `holes[j]`, its mask likewise, the hole's older columns
        masked."""
        width = mask.shape[1]
        for layer, new in zip(self.cache.layers, layers, strict=True):
            layer.place(holes, new.keys, new.values, width)
        self.mask[holes] = 0
        self.mask[holes, -width:] = mask
        self.logits[holes] = logits
        for i, row in zip(holes, joining, strict=True):
            self.rows[i] = row
        self._trim()

    def _trim(self) -> None:
        """Drop the columns on the left that are padding in every row, without a copy (the cache's window moves)."""
        first = int((self.mask.sum(0) > 0).nonzero()[0])
        if first:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.start += first

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, Any, Any]:
        """(cache, mask, next-token logits) of `prompts`, left-padded; through the prefix cache when there is one:
        first the prefixes several prompts share, once each, then every prompt from its longest stored prefix."""
        self.prompt_tokens += sum(len(p) for p in prompts)
        if self.store is None:
            ids, mask = self.engine._left_pad(prompts)
            self.prefill_tokens += int(mask.sum())
            cache, logits = self._forward(ids, mask, None)
            return cache, mask, logits
        version = getattr(self.engine, "weights_version", 0)
        if version != self.weights_version:  # new weights: every stored state is stale
            self.store.clear()
            self.weights_version = version
        for prefix in shared_prefixes(prompts, self.store):
            self._prefill_stored([prefix])
        return self._prefill_stored(prompts)

    def _prefill_stored(self, prompts: list[list[int]]) -> tuple[Any, Any, Any]:
        """Prefill each prompt's tail after its longest stored prefix (the stored states placed before it, left-
        padded, the gap masked), then store every prompt's states."""
        import torch
        from transformers import DynamicCache

        matches = [self.store.match(p) for p in prompts]
        width = max(n for n, _ in matches)
        ids, mask = self.engine._left_pad([p[n:] for p, (n, _) in zip(prompts, matches, strict=True)])
        self.prefill_tokens += int(mask.sum())
        cache = None
        if width:
            sample = next(entry for n, entry in matches if n).layers
            past_mask = torch.zeros((len(prompts), width), dtype=mask.dtype, device=mask.device)
            layers = []
            for layer, (k0, v0) in enumerate(sample):
                keys = k0.new_zeros((len(prompts), k0.shape[0], width, k0.shape[2]))
                values = v0.new_zeros((len(prompts), v0.shape[0], width, v0.shape[2]))
                for row, (n, entry) in enumerate(matches):
                    if n:
                        keys[row, :, width - n :] = entry.layers[layer][0][:, :n]
                        values[row, :, width - n :] = entry.layers[layer][1][:, :n]
                layers.append((keys, values))
            for row, (n, _) in enumerate(matches):
                if n:
                    past_mask[row, width - n :] = 1
            cache = DynamicCache(ddp_cache_data=layers, config=self.engine.model.config)
            mask = torch.cat([past_mask, mask], dim=-1)
        cache, logits = self._forward(ids, mask, cache)
        for row, prompt in enumerate(prompts):
            self.store.add(prompt, lambda row=row: self._row_states(cache, mask, row))
        return cache, mask, logits

    @staticmethod
    def _row_states(cache: Any, mask: Any, row: int) -> list[tuple[Any, Any]]:
        """Row `row`'s keys and values at its real (unmasked) columns, copied out of the batch, per layer."""
        columns = mask[row].nonzero().squeeze(-1)
        return [
            (layer.keys[row].index_select(1, columns), layer.values[row].index_select(1, columns))
            for layer in cache.layers
        ]

    def _forward(self, ids: Any, mask: Any, cache: Any) -> tuple[Any, Any]:
        """One forward of `ids` (the last columns of `mask`) after `cache` (the columns before them)."""
        from transformers import DynamicCache

        positions = mask.cumsum(-1) - 1
        positions = positions.masked_fill(mask == 0, 1)[:, -ids.shape[1] :]
        out = self.engine.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache if cache is not None else DynamicCache(config=self.engine.model.config),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.past_key_values, out.logits[:, -1, :]

    def _decode(self, tokens: list[int]) -> None:
        import torch

        ids = torch.tensor(tokens, dtype=torch.long, device=self.engine.device).unsqueeze(-1)
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=-1)
        self.cache, self.logits = self._forward(ids, self.mask, self.cache)

    def _splice(self, cache: Any, mask: Any, logits: Any, joining: list[_Row]) -> None:
        """The running batch and the prefilled newcomers in one cache, aligned on the right: one copy of each, into
        buffers with `spare` free columns."""
        import torch
        import torch.nn.functional as F  # noqa: N812

        self.copies += 1
        width = max(self.mask.shape[1], mask.shape[1])
        self.cache.layers = [
            self._buffer([old, new], width) for old, new in zip(self.cache.layers, cache.layers, strict=True)
        ]

        def widen(t: Any) -> Any:  # left-pad the mask's columns up to `width`
            missing = width - t.shape[1]
            return F.pad(t, [missing, 0]) if missing else t

        self.mask = torch.cat([widen(self.mask), widen(mask)], dim=0)
        self.logits = torch.cat([self.logits, logits], dim=0)
        self.rows = self.rows + joining

    def _keep(self, keep: list[int]) -> None:
        """Drop finished rows, then the columns that are padding in every remaining row."""
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.mask = self.logits = None
            return
        self.copies += 1
        import torch

        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.mask = self.mask.index_select(0, index)
        self.logits = self.logits.index_select(0, index)
        for layer in self.cache.layers:
            layer.select(index)
        self._trim()

    def _buffered(self, cache: Any) -> Any:
        """`cache` (a prefill's DynamicCache) with BufferedLayers: its states copied before `spare` free columns."""
        cache.layers = [self._buffer([layer], layer.keys.shape[2]) for layer in cache.layers]
        return cache

    def _buffer(self, parts: list[Any], width: int) -> Any:
        """One BufferedLayer holding the rows of the cache layers `parts`, one after another, each aligned on the
        right of `width` columns (the columns left of a shorter part zero, masked) and `spare` free columns after."""
        buffers = []
        for name in ("keys", "values"):
            first = getattr(parts[0], name)
            rows = sum(getattr(part, name).shape[0] for part in parts)
            out = first.new_zeros((rows, first.shape[1], width + self.spare, first.shape[3]))
            row = 0
            for part in parts:
                t = getattr(part, name)
                out[row : row + t.shape[0], :, width - t.shape[2] : width] = t
                row += t.shape[0]
            buffers.append(out)
        return _buffered_layer_class()(buffers[0], buffers[1], width, self.spare)


@functools.cache
def _buffered_layer_class() -> type:
    """BufferedLayer, defined on first use: it subclasses transformers' DynamicLayer, imported lazily."""
    from transformers.cache_utils import DynamicLayer

    class BufferedLayer(DynamicLayer):
        """A DynamicLayer whose keys and values [B, H, ·, D] are columns [start, end) of buffers with free columns
        after `end`: `update` writes a step's states in place while they fit, and reallocates with `spare` free
        columns when they do not."""

        def __init__(self, keys: Any, values: Any, end: int, spare: int):
            super().__init__()
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True
            self.spare = spare
            self._k, self._v, self.start, self.end = keys, values, 0, end

        # transformers' own DynamicLayer code assigns keys and values: an assigned tensor becomes a full buffer
        @property
        def keys(self) -> Any:
            return None if self._k is None else self._k[:, :, self.start : self.end]

        @keys.setter
        def keys(self, t: Any) -> None:
            self._k, self.start, self.end = t, 0, (0 if t is None else t.shape[2])

        @property
        def values(self) -> Any:
            return None if self._v is None else self._v[:, :, self.start : self.end]

        @values.setter
        def values(self, t: Any) -> None:
            self._v = t

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            import torch

            n = key_states.shape[2]
            if self.end + n > self._k.shape[2]:  # full: the live columns, the new ones, then free columns again
                k, v = self.keys, self.values
                free = (k.shape[0], k.shape[1], self.spare, k.shape[3])
                self._k = torch.cat([k, key_states, k.new_empty(free)], dim=2)
                self._v = torch.cat([v, value_states, v.new_empty(free)], dim=2)
                self.start, self.end = 0, k.shape[2] + n
            else:
                self._k[:, :, self.end : self.end + n] = key_states
                self._v[:, :, self.end : self.end + n] = value_states
                self.end += n
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return 0 if self._k is None else self.end - self.start

        def place(self, rows: list[int], keys: Any, values: Any, width: int) -> None:
            """Write `keys`/`values` [len(rows), H, width, D] into the live columns' last `width` of rows `rows`."""
            for j, row in enumerate(rows):
                self._k[row, :, self.end - width : self.end] = keys[j]
                self._v[row, :, self.end - width : self.end] = values[j]

        def select(self, rows: Any, first: int = 0) -> None:
            """Keep batch rows `rows` (one copy, free columns included) and drop the first `first` live columns."""
            self._k = self._k.index_select(0, rows)
            self._v = self._v.index_select(0, rows)
            self.start += first

    return BufferedLayer


def _plain_cache(engine: Any) -> bool:
    """Whether the model's cache is plain full attention (every layer a DynamicLayer), which a stored prefix fits."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = DynamicCache(config=engine.model.config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def race_choice(scores, generators: list, temperature: float, top_p: float):
    """The token each row draws (`scores` [B, V]; row b from `generators[b]`): temperature, then top-p, then the
    exponential race argmax(p / E), E ~ Exp(1), V draws a row. Shared by `generate` and continuous batching, so both
    draw the same tokens from the same seeds."""
    import torch

    probs = torch.softmax(scores.float() / temperature, dim=-1)  # [B, V]
    if top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        # drop a token when the tokens above it already hold top_p of the mass (the first is always kept)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) > top_p
        probs = probs.masked_fill(drop_sorted.scatter(-1, idx, drop_sorted), 0.0)
    race = torch.empty_like(probs)
    for row, gen in enumerate(generators):
        race[row].exponential_(generator=gen)
    return (probs / race).argmax(dim=-1)
