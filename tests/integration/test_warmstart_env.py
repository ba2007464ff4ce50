"""The warm start on an environment other than ALFWorld (text Sokoban, the method check's): the environment's own expert
(shortest plan by BFS) plays training rooms through the generic EnvPool, every turn labelled with the expert's move
at that state, noise included; acting examples read back as that move; a tiny model trains, saves and records it."""

from __future__ import annotations

import json

import pytest

from seedcli.envs import get_env
from seedcli.envs.sokoban.expert import solve
from seedcli.envs.sokoban.game import ACTION_NAMES, Sokoban
from tests.helpers_models import SMALL_SHAPE

NOISE = 0.3


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    from seedcli.stages.demos import env_demonstrations

    cache = tmp_path_factory.mktemp("demos")
    env = get_env("sokoban")
    episodes, path = env_demonstrations(env, 4, seed=0, noise=NOISE, workers=0, cache_dir=cache)
    return env, episodes, path, cache


def test_sokoban_demonstrations_are_the_bfs_experts_moves(demos):
    env, episodes, path, _ = demos
    assert len(episodes) == 4 and path.exists() and len(path.read_text().splitlines()) == 4
    played_noise = 0
    for demo in episodes:
        traj = demo.trajectory
        assert len(demo.labels) == len(traj.turns)
        # replay the room: each label is the first move of a shortest plan from the state the turn saw
        game = Sokoban(int(traj.task_id), max_steps=env.max_steps, **env.room)
        for turn, label in zip(traj.turns, demo.labels, strict=True):
            plan = solve(game, max_len=64)
            assert label == (ACTION_NAMES[plan[0]] if plan else "still")
            played_noise += turn.action != label
            game.step({v: k for k, v in ACTION_NAMES.items()}[turn.action])
        assert game.success() == traj.won
    assert played_noise > 0  # with noise 0.3 some turns played a random move (and were labelled with the expert's)
    assert sum(d.trajectory.won for d in episodes) >= 3


def test_sokoban_demonstrations_are_cached(demos):
    from seedcli.stages.demos import env_demonstrations

    env, episodes, path, cache = demos
    again, path2 = env_demonstrations(env, 4, seed=0, noise=NOISE, workers=0, cache_dir=cache)
    assert path2 == path
    assert [d.model_dump() for d in again] == [d.model_dump() for d in episodes]


def test_sokoban_acting_examples_read_back_as_the_label(demos, tmp_path):
    from transformers import AutoTokenizer

    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import sample_texts
    from seedcli.stages.demos import demo_examples

    env, episodes, _, _ = demos
    model_dir = build_tiny_model(tmp_path / "m", preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)
    tok = AutoTokenizer.from_pretrained(model_dir)
    examples = demo_examples(episodes, tok, env)
    labels = [lab for d in episodes if d.trajectory.won for lab in d.labels if lab in ("up", "down", "left", "right")]
    assert len(examples) == len(labels) > 0
    for (prompt, response), label in zip(examples, labels, strict=True):
        text = tok.decode(response[:-1])
        assert env.parse_action(text) == (label, True)
        assert "push all the boxes" in tok.decode(prompt) or "Sokoban" in tok.decode(prompt)


def test_sokoban_warm_start_trains_without_skill_writing(demos, tmp_path):
    from seedcli.config import WarmStartConfig
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import sample_texts
    from seedcli.stages.warmstart import WARMSTART_FILE, warm_start

    _, _, _, cache = demos
    model_dir = build_tiny_model(tmp_path / "m", preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)
    cfg = WarmStartConfig(
        model=str(model_dir),
        games=4,
        epochs=2,
        seed=0,
        noise=NOISE,
        workers=0,
        cache_dir=str(cache),
        lr=3e-3,
        check_turns=2,
        env="sokoban",
        skill_writing=False,
    )
    record = warm_start(model_dir, cfg)
    assert record["env"] == "sokoban" and record["skill_examples"] == 0
    assert record["skill_check"]["episodes"] == 0
    assert record["max_steps"] == 15 and record["history"] == 2  # Sokoban's own limits
    assert record["epoch_response_nll"][-1] < record["first_response_nll"]
    assert record["check"]["turns"] == 2
    assert json.loads((model_dir / WARMSTART_FILE).read_text())["turns"] == record["turns"]


def test_model_init_refuses_an_unknown_env_or_warm_start_before_building(tmp_path):
    from typer.testing import CliRunner

    from seedcli.cli import app

    out = tmp_path / "m"
    bad_env = CliRunner().invoke(app, ["model", "init", "--out", str(out), "--warm-start", "expert", "--env", "nope"])
    assert bad_env.exit_code == 2 and "unknown environment 'nope'" in bad_env.stderr and "sokoban" in bad_env.stderr
    bad_kind = CliRunner().invoke(app, ["model", "init", "--out", str(out), "--warm-start", "walkthrough"])
    assert bad_kind.exit_code == 2 and "unknown --warm-start 'walkthrough'; use expert" in bad_kind.stderr
    assert not out.exists()  # nothing was built


def test_search_warm_start_clones_a_free_text_expert(tmp_path):
    """Search lists no admissible actions: its expert's turns are still labels to clone, the DART noise leaves them
    be, and the greedy check reads the replies (each of the three crashed or cloned nothing before)."""
    from seedcli.config import WarmStartConfig
    from seedcli.engines.tiny import build_tiny_model
    from seedcli.envs import sample_texts
    from seedcli.stages.warmstart import warm_start

    model_dir = build_tiny_model(tmp_path / "m", preset="tiny", seed=0, corpus=sample_texts(), **SMALL_SHAPE)
    cfg = WarmStartConfig(model=str(model_dir), games=6, epochs=1, seed=0, noise=NOISE, workers=0,
                          cache_dir=str(tmp_path / "cache"), lr=3e-3, check_turns=2, env="search",
                          skill_writing=False)  # fmt: skip
    record = warm_start(model_dir, cfg)
    assert record["env"] == "search" and record["turns"] > 0  # the won games' turns were cloned
    assert record["check"]["turns"] == 2 and 0.0 <= record["check"]["admissible_rate"] <= 1.0
