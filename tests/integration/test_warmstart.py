"""The expert warm start on real ALFWorld games with a tiny model: the searching expert's demonstrations (with noise)
in the exact agent prompt format, each turn labelled with the expert's action at that state; skill-writing examples
in the exact analysis prompt format whose answers parse; a falling loss, a model that saves and loads, and
warmstart.json beside it."""

from __future__ import annotations

import json

import pytest

from seedcli.envs.alfworld.data import list_games, select_games
from seedcli.envs.alfworld.episode import AlfWorldGame
from seedcli.envs.alfworld.projection import format_response, parse_action
from seedcli.envs.alfworld.prompt import ALFWORLD_ANALYSIS_DESCRIPTION, render_agent_prompt
from tests.helpers_models import SMALL_SHAPE

pytest.importorskip("alfworld")


NOISE = 0.3


@pytest.fixture(scope="module")
def demos(alfworld_root, tmp_path_factory):
    from seedcli.stages.demos import expert_demonstrations

    cache = tmp_path_factory.mktemp("demos")
    episodes, path = expert_demonstrations(2, seed=0, noise=NOISE, max_steps=25, history=5, workers=0, cache_dir=cache)
    return episodes, path, cache


def test_demonstrations_are_labelled_and_cached(demos):
    from seedcli.stages.demos import expert_demonstrations

    episodes, path, cache = demos
    assert len(episodes) == 2
    for d in episodes:
        assert len(d.labels) == len(d.trajectory.turns) > 0
        assert d.trajectory.turns[0].action == d.labels[0]  # no noise on the first turn
    played = [(t.action, label) for d in episodes for t, label in zip(d.trajectory.turns, d.labels, strict=True)]
    assert any(a != label for a, label in played)  # some turns were the injected random action...
    assert sum(a == label for a, label in played) > len(played) / 2  # ...most were the expert's
    assert path.exists() and path.parent == cache
    again, path2 = expert_demonstrations(2, seed=0, noise=NOISE, max_steps=25, history=5, workers=0, cache_dir=cache)
    assert path2 == path
    assert [d.model_dump() for d in again] == [d.model_dump() for d in episodes]


def test_demonstrations_are_the_agent_prompt_collect_renders(demos, alfworld_root):
    """Replay the first game by hand with the searching expert: every demonstration prompt equals what the rollout
    loop renders for that state, and every label is the expert's action in that state (noise turns included)."""
    from seedcli.stages.demos import THINK

    episodes, _, _ = demos
    traj, labels = episodes[0].trajectory, episodes[0].labels
    game = next(g for g in select_games(list_games(alfworld_root, "train"), 2, 0) if g.game_file == traj.game_file)
    env = AlfWorldGame(expert="search")
    try:
        state = env.reset(game)
        history: list[tuple[str, str]] = []
        for i, (turn, label) in enumerate(zip(traj.turns, labels, strict=True), start=1):
            expected = render_agent_prompt(state.task, state.observation, state.admissible, i, history, 5)
            assert turn.prompt == expected
            assert label == state.expert_action
            action, valid = parse_action(turn.response)
            assert valid and turn.response == format_response(THINK, action) and action in state.admissible
            history.append((state.observation, action))
            state = env.step(action)
        assert state.won == traj.won
    finally:
        env.close()


def test_examples_mask_and_end_like_a_generated_turn(demos, tmp_path):
    from transformers import AutoTokenizer

    from seedcli.engines.base import render_chat
    from seedcli.engines.tiny import EOS_TOKEN, build_tiny_model
    from seedcli.envs import sample_texts
    from seedcli.stages.demos import demo_examples, demo_thinks
    from seedcli.stages.warmstart_train import collate

    episodes, _, _ = demos
    model = build_tiny_model(tmp_path / "m", preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)
    tok = AutoTokenizer.from_pretrained(model)
    examples = demo_examples(episodes, tok)
    won = [d for d in episodes if d.trajectory.won]
    assert won, "the searching expert should win at least one of the two games"
    labelled = [
        (t, lab, think)
        for d in won
        for t, lab, think in zip(d.trajectory.turns, d.labels, demo_thinks(d.trajectory), strict=True)
    ]
    usable = [(t, lab, think) for t, lab, think in labelled if lab and lab != "look" and lab in t.admissible]
    assert len(examples) == len(usable)
    turn, label, think = usable[0]
    prompt, response = examples[0]
    assert prompt == render_chat(tok, [{"role": "user", "content": turn.prompt}])
    assert response[-1] == tok.convert_tokens_to_ids(EOS_TOKEN)
    assert tok.decode(response[:-1]) == format_response(think, label)  # the label, not the (noisy) action played
    ids, attn, weight = collate(examples, [0, 1], pad_id=0, prompt_weight=0.0)
    # response tokens weigh 1, prompt and padding 0
    assert weight[0].sum().item() == len(response)
    assert weight[0, len(prompt) :].tolist()[: len(response)] == [1.0] * len(response)
    assert attn[0].sum().item() == len(prompt) + len(response)


def test_skill_writing_examples_are_the_self_analyzer_prompt_and_parse(demos, tmp_path):
    from transformers import AutoTokenizer

    from seedcli.analyzers import analysis_messages
    from seedcli.analyzers.parse import parse_skill
    from seedcli.analyzers.rules import rules_skill
    from seedcli.engines.base import render_chat
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import sample_texts
    from seedcli.prompts import analysis_turns, render_analysis_prompt
    from seedcli.stages.demos import analysis_example_texts, analysis_examples

    episodes, _, _ = demos
    pairs = analysis_example_texts(episodes, max_chars=3000)
    assert len(pairs) == len(episodes)  # won and lost episodes alike
    for d, (prompt, answer) in zip(episodes, pairs, strict=True):
        t = d.trajectory
        assert prompt == render_analysis_prompt(
            t.task, t.won, analysis_turns(t), 3000, description=ALFWORLD_ANALYSIS_DESCRIPTION
        )
        assert len(prompt) <= 3000 or "earlier step(s) omitted" in prompt
        parsed = parse_skill(answer)
        assert parsed.kept and parsed.skill == rules_skill(t)[1]
    tok = AutoTokenizer.from_pretrained(
        build_tiny_model(tmp_path / "m", preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)
    )
    ids, response = analysis_examples(pairs, tok)[0]
    assert ids == render_chat(tok, analysis_messages(pairs[0][0]))


def test_warm_start_trains_saves_and_loads(demos, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from seedcli.config import WarmStartConfig
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import sample_texts
    from seedcli.stages.warmstart import WARMSTART_FILE, warm_start

    _, _, cache = demos
    model_dir = build_tiny_model(tmp_path / "m", preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)
    before = AutoModelForCausalLM.from_pretrained(model_dir).model.embed_tokens.weight.clone()
    cfg = WarmStartConfig(
        model=str(model_dir),
        games=2,
        epochs=2,
        seed=0,
        shape="keep",  # train the given model
        noise=NOISE,
        max_steps=25,
        workers=0,
        cache_dir=str(cache),  # the fixture's demonstrations: same games, noise and step limit
        batch_tokens=4096,
        lr=3e-3,
        check_turns=2,
        check_skills=1,
    )
    record = warm_start(model_dir, cfg)
    assert record["games"] == 2 and record["epochs"] == 2
    assert record["skill_examples"] == 1 and record["skill_check"]["episodes"] == 1  # one held out for the check
    # the loss on the response tokens goes down: the second epoch is below the first batch
    assert record["epoch_response_nll"][-1] < record["first_response_nll"]
    saved = json.loads((model_dir / WARMSTART_FILE).read_text())
    assert saved["turns"] == record["turns"] and len(saved["curve"]) == len(record["curve"])
    after = AutoModelForCausalLM.from_pretrained(model_dir)
    assert not torch.equal(before, after.model.embed_tokens.weight)
    assert after.config.hidden_size == SMALL_SHAPE["hidden_size"]  # shape keep: the given model
