"""The hf engine's prefix cache: a prompt that begins like an earlier one prefills only its tail, and its completion
is the one a full prefill gives (same tokens, log-probs equal up to float noise); shared prefixes among prompts that
join together prefill once; new weights empty the store; the store keeps to its byte budget."""

from __future__ import annotations

import pytest
import torch

from seedcli.engines.prefix_cache import MIN_SHARE, PrefixStore, shared_prefixes

torch.set_num_threads(1)

RULES = "You are an expert card game player. Build a formula that evaluates to 12 with the two cards. " * 3


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from seedcli.engines import load_engine
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import tokenizer_texts

    path = build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", preset="tiny", seed=0, corpus=tokenizer_texts())
    return load_engine("hf", path, device="cpu", max_batch=4)


def _prompt(engine, cards: str, formula: str) -> list[int]:
    text = f"{RULES}The cards are {cards}. The current formula is: '{formula}'. Append the next character."
    return engine.render([{"role": "user", "content": text}])


def _serve(engine, prompts: list[list[int]], *, cache_mb: int, trickle: int, batcher=None):
    """Completions of `prompts` (sampled, own seeds), `trickle` admitted at first and one more as each finishes."""
    engine.prefix_cache_bytes = cache_mb << 20
    batcher = batcher or engine.batcher()
    queue = list(enumerate(prompts))
    out = {}

    def add(i, p):
        batcher.add(i, p, seed=1000 + i, temperature=1.0, max_new_tokens=6 + 3 * (i % 3))

    for i, p in queue[:trickle]:
        add(i, p)
    queue = queue[trickle:]
    while batcher.busy:
        for key, c in batcher.step():
            out[key] = c
            if queue:
                add(*queue.pop(0))
    return out, batcher


def _assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].token_ids == b[key].token_ids and a[key].finish_reason == b[key].finish_reason
        assert max((abs(x - y) for x, y in zip(a[key].logprobs, b[key].logprobs, strict=True)), default=0) < 1e-4


@pytest.mark.parametrize("trickle", [8, 1])  # a group's first turn joins at once; later turns join one by one
def test_cached_prefill_gives_full_prefills_completions(engine, trickle):
    # two games of four episodes: identical first prompts in a group, later prompts differing near the end
    prompts = [_prompt(engine, cards, formula) for cards in ("K and 2", "5 and 7") for formula in ("", "", "1", "1+")]
    full, plain = _serve(engine, prompts, cache_mb=0, trickle=trickle)
    cached, batcher = _serve(engine, prompts, cache_mb=64, trickle=trickle)
    _assert_same(cached, full)
    assert plain.store is None and plain.prefill_tokens == plain.prompt_tokens == sum(map(len, prompts))
    assert batcher.prompt_tokens == plain.prompt_tokens
    # the rules are prefilled once, not eight times
    assert batcher.prefill_tokens < plain.prefill_tokens / 2


def test_prompts_joining_together_share_their_common_prefix_once(engine):
    p = _prompt(engine, "K and 2", "")
    batcher = _serve(engine, [p] * 4, cache_mb=64, trickle=4)[1]
    # the shared prefix (all but the last token) once, then each prompt's last token
    assert batcher.prefill_tokens == (len(p) - 1) + 4


def test_new_weights_empty_the_store(engine):
    prompts = [_prompt(engine, "K and 2", f) for f in ("", "1", "1+")]
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    try:
        _, batcher = _serve(engine, prompts, cache_mb=64, trickle=3)
        assert len(batcher.store) > 0
        changed = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}
        engine.update_weights(changed)
        reused, _ = _serve(engine, prompts, cache_mb=64, trickle=3, batcher=batcher)  # the same batcher
        fresh, _ = _serve(engine, prompts, cache_mb=0, trickle=3)
        _assert_same(reused, fresh)
    finally:
        engine.update_weights(state)


def _layers(n: int, value: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((1, n, 2), value), torch.full((1, n, 2), value)) for _ in range(2)]  # 32 bytes a token


def test_store_matches_the_longest_prefix_but_never_the_last_token():
    store = PrefixStore(budget_bytes=1 << 20)
    a = list(range(40))
    store.add(a, lambda: _layers(40))
    store.add(a[:30] + [99] * 10, lambda: _layers(40, 1.0))
    n, entry = store.match(a + [7])
    assert n == 40 and list(entry.tokens) == a
    n, _ = store.match(a)  # the prompt itself: its last token is prefilled again for its logits
    assert n == 39
    n, entry = store.match(a[:30] + [99, 99, 5])
    assert n == 32 and float(entry.layers[0][0][0, 0, 0]) == 1.0
    assert store.match(a[: MIN_SHARE - 2] + [-5] * 20) == (0, None)  # too short a share to use


def test_store_drops_covered_prefixes_and_keeps_to_its_budget():
    store = PrefixStore(budget_bytes=32 * 100)  # room for 100 tokens
    store.add(list(range(20)), lambda: _layers(20))
    store.add(list(range(30)), lambda: _layers(30))  # extends the first: it replaces it
    assert [len(e.tokens) for e in store.entries.values()] == [30]
    copied = []
    store.add(list(range(25)), lambda: copied.append(1) or _layers(25))  # a prefix of a stored prompt: nothing added
    assert not copied  # and its states are never copied out of the batch
    assert len(store) == 1 and store.nbytes == 30 * 32
    store.add([1000 + i for i in range(40)], lambda: _layers(40))
    store.match(list(range(30)) + [1])  # used: now the most recent
    store.add([2000 + i for i in range(40)], lambda: _layers(40))  # 110 tokens: the least recently used goes
    assert sorted(int(e.tokens[0]) for e in store.entries.values()) == [0, 2000]
    assert store.nbytes == 70 * 32 <= store.budget_bytes


def test_shared_prefixes_are_the_groups_heads_shortest_first():
    store = PrefixStore(budget_bytes=1 << 20)
    head = list(range(100, 130))
    game_a, game_b = head + list(range(30)), head + list(range(500, 530))
    prefixes = shared_prefixes([game_a, game_b, game_a, game_b, [7] * 40], store)
    assert prefixes == [head, game_a[:-1], game_b[:-1]]
    store.add(game_a[:-1], lambda: _layers(len(game_a) - 1))
    assert shared_prefixes([game_a, game_a], store) == []  # the store already gives it
