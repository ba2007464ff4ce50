"""The expert warm start on real ALFWorld games with a tiny model: demonstrations in the exact agent prompt format,
a falling loss, a model that saves and loads, and warmstart.json beside it."""

from __future__ import annotations

import json

import pytest

from seedcli.envs.alfworld import AlfWorldGame, list_games, resolve_data_root, select_games
from seedcli.errors import UserError
from seedcli.prompts import format_response, parse_action, render_agent_prompt

pytest.importorskip("alfworld")

# small enough for two shared cores: 2 layers, hidden 64 would break vLLM's head_dim rule but is fine for hf
SMALL_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


@pytest.fixture(scope="module")
def data_root():
    try:
        return resolve_data_root()
    except UserError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def demos(data_root, tmp_path_factory):
    from seedcli.stages.warmstart import expert_demonstrations

    cache = tmp_path_factory.mktemp("demos")
    trajectories, path = expert_demonstrations(2, seed=0, max_steps=30, history=5, workers=0, cache_dir=cache)
    return trajectories, path, cache


def test_demonstrations_are_won_and_cached(demos):
    from seedcli.stages.warmstart import expert_demonstrations

    trajectories, path, cache = demos
    assert len(trajectories) == 2
    assert all(t.won for t in trajectories)  # the expert follows the walkthrough: every game is won
    assert path.exists() and path.parent == cache
    again, path2 = expert_demonstrations(2, seed=0, max_steps=30, history=5, workers=0, cache_dir=cache)
    assert path2 == path
    assert [t.model_dump() for t in again] == [t.model_dump() for t in trajectories]


def test_demonstrations_are_the_agent_prompt_collect_renders(demos, data_root):
    """Replay the first game by hand: every demonstration prompt equals what the rollout loop renders for that
    state, and the response is a well-formed turn whose action is the expert's."""
    trajectories, _, _ = demos
    traj = trajectories[0]
    game = next(g for g in select_games(list_games(data_root, "train"), 2, 0) if g.game_file == traj.game_file)
    env = AlfWorldGame(expert=True)
    try:
        state = env.reset(game)
        history: list[tuple[str, str]] = []
        for i, turn in enumerate(traj.turns, start=1):
            expected = render_agent_prompt(state.task, state.observation, state.admissible, i, history, 5)
            assert turn.prompt == expected
            assert turn.response == format_response("I follow the expert plan.", state.expert_action)
            action, valid = parse_action(turn.response)
            assert valid and action == state.expert_action and action in state.admissible
            history.append((state.observation, action))
            state = env.step(action)
        assert state.won
    finally:
        env.close()


def test_examples_mask_and_end_like_a_generated_turn(demos, tmp_path):
    from transformers import AutoTokenizer

    from seedcli.engines.base import render_chat
    from seedcli.engines.tiny import EOS_TOKEN, build_tiny_model
    from seedcli.stages.warmstart import _collate, demo_examples

    trajectories, _, _ = demos
    model = build_tiny_model(tmp_path / "m", preset="tiny", seed=0, **SMALL_SHAPE)
    tok = AutoTokenizer.from_pretrained(model)
    examples = demo_examples(trajectories, tok)
    assert len(examples) == sum(len(t.turns) for t in trajectories)
    prompt, response = examples[0]
    assert prompt == render_chat(tok, [{"role": "user", "content": trajectories[0].turns[0].prompt}])
    assert response[-1] == tok.convert_tokens_to_ids(EOS_TOKEN)
    assert tok.decode(response[:-1]) == trajectories[0].turns[0].response
    ids, attn, weight = _collate(examples, [0, 1], pad_id=0, prompt_weight=0.0)
    # response tokens weigh 1, prompt and padding 0
    assert weight[0].sum().item() == len(response)
    assert weight[0, len(prompt) :].tolist()[: len(response)] == [1.0] * len(response)
    assert attn[0].sum().item() == len(prompt) + len(response)


def test_warm_start_trains_saves_and_loads(demos, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from seedcli.engines.tiny import build_tiny_model
    from seedcli.stages.warmstart import WARMSTART_FILE, warm_start

    _, _, cache = demos
    model_dir = build_tiny_model(tmp_path / "m", preset="tiny", seed=0, **SMALL_SHAPE)
    before = AutoModelForCausalLM.from_pretrained(model_dir).model.embed_tokens.weight.clone()
    record = warm_start(
        model_dir,
        games=2,
        epochs=2,
        seed=0,
        shape=None,
        workers=0,
        cache_dir=cache,
        batch_tokens=4096,
        lr=3e-3,
        check_turns=2,
    )
    assert record["games"] == 2 and record["epochs"] == 2
    # the loss on the response tokens goes down: the second epoch is below the first batch
    assert record["epoch_response_nll"][-1] < record["first_response_nll"]
    saved = json.loads((model_dir / WARMSTART_FILE).read_text())
    assert saved["turns"] == record["turns"] and len(saved["curve"]) == len(record["curve"])
    after = AutoModelForCausalLM.from_pretrained(model_dir)
    assert not torch.equal(before, after.model.embed_tokens.weight)
    assert after.config.hidden_size == SMALL_SHAPE["hidden_size"]  # shape=None keeps the given model
