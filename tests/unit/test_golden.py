"""Golden copies that prove a change of layout changed nothing a run computes: every config hash (the `<hash8>` of
`runs/<stage>/<time>-<hash8>`, and what `--resume auto` matches on) and every environment's rendered prompts, byte for
byte (the agent prompt on a first turn and on a turn with history, the skill-augmented prompt, the analysis prompt of
a small trajectory, and the templates the tiny tokenizer learns).

The files under tests/golden/ were written by the code before issue 20 moved ALFWorld's prompts into
`seedcli/envs/alfworld/`. A change that is meant to alter a prompt (with a new prompt version) or a config hash
rewrites them on purpose:

    .venv/bin/python tests/unit/test_golden.py --write

No game data is needed: prompts are rendered from fixed strings.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
HASHES_FILE = GOLDEN / "config_hashes.json"
PROMPTS_DIR = GOLDEN / "prompts"

STAGES = ("collect", "annotate", "sft", "rl", "eval")
ENVS = ("alfworld", "webshop", "search")  # golden prompts (Sokoban's and EZPoints' are checked against verl-agent's
# own templates by sha256 in tests/unit/test_visual_envs.py)
CONFIG_ENVS = (*ENVS, "sokoban", "ezpoints")  # every environment's stage defaults

# ---------------------------------------------------------------------------------------------------- config hashes

# (stage, preset file or None, options as the CLI passes them, key=value overrides) beyond the presets and the
# defaults: a value set on the command line, env options (hashed only when set), eval's category filter
EXTRA_CONFIGS: dict[str, tuple[str, str | None, dict, list[str]]] = {
    "collect:search:env_options": ("collect", None, {"env": "search", "env_options": "{topk: 3}"}, []),
    "rl:search:search_url": (
        "rl",
        None,
        {"env": "search", "env_options": {"search_url": "http://127.0.0.1:8000/retrieve"}},
        [],
    ),
    "eval:webshop:goal_seed": ("eval", None, {"env": "webshop", "env_options": {"goal_seed": 1}}, []),
    "eval:search:datasets": ("eval", None, {"env": "search", "limit": 5}, ["datasets=nq,hotpotqa"]),
    "eval:alfworld:seen": ("eval", None, {"split": "seen", "max_steps": 50}, ["temperature=0.7"]),
    "collect:tiny+overrides": ("collect", "tiny", {"tasks": 12}, ["history=3", "task_types=pick,clean"]),
    "rl:paper+algo": ("rl", "alfworld/paper_qwen25_3b", {"algo": "grpo"}, ["analyzer=none", "workers=4"]),
    "sft:lora": ("sft", None, {}, ["lora=true", "lora_r=8"]),
    "annotate:openai": ("annotate", None, {"analyzer": "openai", "model": "gpt-x"}, ["concurrency=2"]),
}


def config_cases() -> dict[str, tuple[str, str | None, dict, list[str]]]:
    """Every preset under configs/ for every stage, every stage's defaults for every environment, and the extras."""
    from seedcli.config import CONFIGS_DIR, STAGE_CONFIGS

    cases: dict[str, tuple[str, str | None, dict, list[str]]] = {}
    for path in sorted(CONFIGS_DIR.rglob("*.yaml")):
        rel = path.relative_to(CONFIGS_DIR).as_posix()
        for stage in STAGES:
            cases[f"{rel}:{stage}"] = (stage, str(path), {}, [])
    for stage in STAGES:
        if "env" in STAGE_CONFIGS[stage].model_fields:
            for env in CONFIG_ENVS:
                cases[f"defaults:{env}:{stage}"] = (stage, None, {"env": env}, [])
        else:
            cases[f"defaults:{stage}"] = (stage, None, {}, [])
    cases.update(EXTRA_CONFIGS)
    return cases


def config_hashes() -> dict[str, str]:
    from seedcli.config import build_config

    return {
        name: build_config(stage, config_file=preset, cli=dict(cli), overrides=list(overrides)).config_hash()
        for name, (stage, preset, cli, overrides) in config_cases().items()
    }


# ------------------------------------------------------------------------------------------------------------ prompts

# Per environment: the task, the (observation, admissible actions) of the turn, and the earlier (observation, action)
# pairs of the turn with history (history_length 2 of 3: the first pair is cut).
PROMPT_INPUTS: dict[str, dict] = {
    "alfworld": {
        "task": "put a clean mug in coffeemachine.",
        "first": (
            "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you "
            "see a cabinet 1, a coffeemachine 1, a countertop 1, and a sinkbasin 1.",
            ["go to cabinet 1", "go to coffeemachine 1", "go to countertop 1", "go to sinkbasin 1", "help",
             "inventory", "look"],
        ),
        "now": (
            "You clean the mug 1 using the sinkbasin 1.",
            ["go to coffeemachine 1", "go to countertop 1", "examine mug 1", "help", "inventory", "look"],
        ),
        "history": [
            ("You are in the middle of a room.", "go to cabinet 1"),
            ("You arrive at countertop 1. On the countertop 1, you see a mug 1.", "take mug 1 from countertop 1"),
            ("You pick up the mug 1 from the countertop 1.", "go to sinkbasin 1"),
        ],
    },
    "webshop": {
        "task": "i need a long lasting 6.76 fl oz bottle of l'eau d'issey, and price lower than 100.00 dollars",
        "first": ("Search", ["search[<your query>]"]),
        "now": (
            "Back to Search [SEP] Page 1 (Total results: 2) [SEP] Next > [SEP] B000VOHH8I [SEP] L'eau D'issey By "
            "Issey Miyake for Women Eau De Toilette Spray, 6.76 fl oz [SEP] $64.98 [SEP] B09KYDTW1S [SEP] Issey "
            "Miyake L'Eau d'Issey Eau de Toilette [SEP] $86.0",
            ["click[back to search]", "click[next >]", "click[b000vohh8i]", "click[b09kydtw1s]"],
        ),
        "history": [
            ("Search", "search[l'eau d'issey 6.76 fl oz bottle]"),
            ("Back to Search [SEP] Page 1 (Total results: 2) [SEP] Next > [SEP] B000VOHH8I", "click[next >]"),
            ("Back to Search [SEP] < Prev [SEP] Page 2 (Total results: 2)", "click[< prev]"),
        ],
    },
    "search": {
        "task": "who wrote the novel the name of the rose?",
        "first": ("", None),
        "now": (
            '<information>Doc 1(Title: "The Name of the Rose") The Name of the Rose is the 1980 debut novel by '
            "Italian author Umberto Eco.\nDoc 2(Title: \"Umberto Eco\") Umberto Eco was an Italian medievalist, "
            "philosopher, semiotician, novelist.</information>",
            None,
        ),
        "history": [
            ("", "<search>the name of the rose novel</search>"),
            ("<information>Doc 1(Title: \"Rose\") A rose is a woody perennial.</information>",
             "<search>the name of the rose author</search>"),
            ("<information>Doc 1(Title: \"Novel\") A novel is a long work of fiction.</information>",
             "<search>the name of the rose 1980 novel author</search>"),
        ],
    },
}  # fmt: skip
SKILL = "Find the object first, then act on it at the place the task names; check the result before you finish."
STEP_SKILL = "Open the fridge before you look for the egg inside it."
HISTORY_LENGTH = 2

# The analysis prompt's trajectory: three turns, the second invalid; won (ALFWorld), half-scored (WebShop), lost.
# Its `_cut` copy is rendered one character too long for the whole prompt, so the oldest step is dropped.
ANALYSIS_OUTCOME: dict[str, tuple[bool, float]] = {
    "alfworld": (True, 1.0),
    "webshop": (False, 0.5),
    "search": (False, 0.0),
}


def analysis_trajectory(env: str):
    from seedcli.records import Trajectory, Turn

    inputs = PROMPT_INPUTS[env]
    pairs = [*inputs["history"]]
    turns = [
        Turn(
            step=i + 1,
            observation=obs,
            admissible=[],
            prompt="",
            response=f"<think>step {i + 1}: I act on what I see.</think>\n<action>{action}</action>"
            if i != 1
            else f"I will {action} now.",
            action=action,
            valid=i != 1,
        )
        for i, (obs, action) in enumerate(pairs)
    ]
    won, score = ANALYSIS_OUTCOME[env]
    return Trajectory(
        episode_id="e0",
        group_id="g0",
        env=env,
        task_id="t0",
        split="train",
        category="c",
        task=inputs["task"],
        turns=turns,
        won=won,
        score=score,
        reward=10.0 * won,
        length=len(turns),
        engine="hf",
        model_id="m",
        model_hash="h",
        sampling={},
        prompt_version="v",
        seed=0,
    )


def render_prompts() -> dict[str, str]:
    """File name -> text of every golden prompt, rendered by the current code."""
    from seedcli.envs import get_env
    from seedcli.prompts import (
        ANALYSIS_PROMPT_VERSION,
        ANALYSIS_STEP_PROMPT_VERSION,
        SCHEMA_REMINDER,
        render_trajectory_analysis,
        schema_reminder,
    )

    out: dict[str, str] = {}
    versions: dict[str, dict[str, str]] = {
        "analysis": {"version": ANALYSIS_PROMPT_VERSION},
        "analysis_step": {"version": ANALYSIS_STEP_PROMPT_VERSION},
    }
    for name in ENVS:
        env = get_env(name)
        inputs = PROMPT_INPUTS[name]
        first_obs, first_adm = inputs["first"]
        now_obs, now_adm = inputs["now"]
        history = inputs["history"]
        first = env.render_prompt(inputs["task"], first_obs, first_adm, 1, [], HISTORY_LENGTH)
        later = env.render_prompt(inputs["task"], now_obs, now_adm, len(history) + 1, history, HISTORY_LENGTH)
        out[f"{name}_agent_first.txt"] = first
        out[f"{name}_agent_history.txt"] = later
        out[f"{name}_skill_first.txt"] = env.insert_skill(first, SKILL)
        out[f"{name}_skill_history.txt"] = env.insert_skill(later, SKILL)
        traj = analysis_trajectory(name)
        description = env.analysis_description
        full = render_trajectory_analysis(traj, description=description)
        out[f"{name}_analysis.txt"] = full
        out[f"{name}_analysis_cut.txt"] = render_trajectory_analysis(traj, len(full) - 1, description=description)
        # skill_mode episode_step / step_only: the step-skill request and the critical-step block
        out[f"{name}_analysis_step.txt"] = render_trajectory_analysis(
            traj, description=description, skill_mode="episode_step", max_step_skills=2
        )
        out[f"{name}_analysis_step_only.txt"] = render_trajectory_analysis(
            traj, description=description, skill_mode="step_only", max_step_skills=2
        )
        out[f"{name}_step_skill_history.txt"] = env.insert_step_skill(later, STEP_SKILL)
        versions[name] = {
            "prompt_version": env.prompt_version,
            "task_line_prefix": env.task_line_prefix,
            "analysis_description": description,
        }
    out["schema_reminder.txt"] = SCHEMA_REMINDER
    out["schema_reminder_step.txt"] = schema_reminder("episode_step")
    out["schema_reminder_step_only.txt"] = schema_reminder("step_only")
    out["tokenizer_corpus.txt"] = "\n<<<text>>>\n".join(tokenizer_templates())
    out["versions.json"] = json.dumps(versions, indent=1, sort_keys=True) + "\n"
    return out


def tokenizer_templates() -> list[str]:
    """The rendered templates the tiny tokenizer learns besides the environments' data."""
    from seedcli.envs import template_texts

    return template_texts()


# -------------------------------------------------------------------------------------------------------------- tests


def test_config_hashes_are_unchanged():
    golden = json.loads(HASHES_FILE.read_text())
    now = config_hashes()
    missing = sorted(set(golden) - set(now))
    assert not missing, f"golden config cases no longer computed: {missing}"
    changed = {k: (golden[k][:8], now[k][:8]) for k in golden if now[k] != golden[k]}
    assert not changed, f"config hashes changed (golden, now): {changed}"


def test_golden_files_cover_every_preset_and_environment():
    golden = json.loads(HASHES_FILE.read_text())
    assert set(config_cases()) <= set(golden), "a preset was added: regenerate with --write"
    assert len({(k.split(":")[0]) for k in golden if k.endswith(".yaml:rl")}) >= 7
    names = {p.name for p in PROMPTS_DIR.iterdir()}
    for env in ENVS:
        assert {f"{env}_agent_first.txt", f"{env}_skill_history.txt", f"{env}_analysis_cut.txt"} <= names


@pytest.mark.parametrize("name", sorted(p.name for p in PROMPTS_DIR.iterdir()) if PROMPTS_DIR.is_dir() else [])
def test_prompt_is_byte_identical(name, rendered):
    assert name in rendered, f"{name} is no longer rendered"
    golden = (PROMPTS_DIR / name).read_bytes()
    assert rendered[name].encode("utf-8") == golden, f"{name} differs from tests/golden/prompts/{name}"


def test_golden_prompts_exercise_what_they_claim(rendered):
    # the inputs reach the parts of the templates they are meant to: history cut, skill placed, steps dropped
    for env in ENVS:
        later, skilled = rendered[f"{env}_agent_history.txt"], rendered[f"{env}_skill_history.txt"]
        assert SKILL in skilled and SKILL not in later and len(skilled) > len(later)
        assert PROMPT_INPUTS[env]["history"][-1][1] in later
        assert PROMPT_INPUTS[env]["history"][0][1] not in later  # history_length 2 of 3
        assert "[1 earlier step(s) omitted]" in rendered[f"{env}_analysis_cut.txt"]
        assert "INVALID (format error)" in rendered[f"{env}_analysis.txt"]
        step = rendered[f"{env}_step_skill_history.txt"]
        turn_line = "Now it's your turn"
        assert STEP_SKILL in step and step.replace(STEP_SKILL, "") != later
        assert (
            step.index(STEP_SKILL) < step.index(turn_line) if turn_line in later else step.rstrip().endswith(STEP_SKILL)
        )
        assert "Also pick at most 2 critical step(s)" in rendered[f"{env}_analysis_step.txt"]
        assert '"episode_skill"' not in rendered[f"{env}_analysis_step_only.txt"].split("Pick at most")[-1]
    assert "(score 0.50 of 1)" in rendered["webshop_analysis.txt"]


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return render_prompts()


def write() -> None:
    PROMPTS_DIR.mkdir(parents=True, exist_ok=True)
    HASHES_FILE.write_text(json.dumps(config_hashes(), indent=1, sort_keys=True) + "\n")
    for name, text in render_prompts().items():
        (PROMPTS_DIR / name).write_bytes(text.encode("utf-8"))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    write()
