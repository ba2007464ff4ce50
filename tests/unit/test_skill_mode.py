"""Step skills (`skill_mode: episode_only | episode_step | step_only`, the SEED code's `algorithm.seed.skill_mode`)
and the analysis dumps (`dump_analyses`), each against hand-written expectations: the parser's step skills (valid,
out of range, over the cap), the analysis prompt's request, where a step skill goes in a turn's prompt, which turn
gets which teacher prompt (and no OPD without one under step_only), the self-analyzer carrying them, the config, and
the dump files."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from seedcli.analyzers.parse import (
    MISSING_STEP_SKILLS,
    STEP_BAD_INDEX,
    STEP_DUPLICATE,
    STEP_NOT_OBJECT,
    STEP_OUT_OF_RANGE,
    STEP_OVER_CAP,
    STEP_PLACEHOLDER,
    STEP_TOO_SHORT,
    TOO_SHORT,
    parse_skill,
)
from seedcli.analyzers.policy import SelfAnalysis
from seedcli.config import RLConfig, build_config
from seedcli.engines.base import Completion
from seedcli.envs import get_env
from seedcli.envs.alfworld.prompt import ALFWORLD_ANALYSIS_DESCRIPTION, render_agent_prompt
from seedcli.errors import UserError
from seedcli.prompts import (
    STEP_ONLY_SCHEMA_REMINDER,
    STEP_SCHEMA_REMINDER,
    analysis_prompt_version,
    insert_step_skill,
    render_analysis_prompt,
)
from seedcli.records import Trajectory, Turn
from seedcli.rl.analyse import Batch, analyse, gather_episodes, guard_step_skills
from seedcli.rl.context import EnvHooks, Plan
from seedcli.rl.distributed import DistInfo
from seedcli.rl.logprobs import Scorer
from seedcli.rl.metrics import step_skill_metrics
from seedcli.rl.optimize import LossWeights
from seedcli.rl.rescore import Rescored, rescore
from seedcli.rl.run_log import write_dumps
from seedcli.rl.samples import build_turn_samples
from tests.helpers_models import tiny_lm

torch.set_num_threads(1)

ALFWORLD = get_env("alfworld")
EPISODE_SKILL = "Open the fridge before you look for the mug anywhere else."
STEP_SKILL = "Go to the fridge now and open it."
TASK = "put a cool mug in cabinet."


def answer(**fields) -> str:
    return json.dumps({"episode_summary": "The agent wandered.", **fields})


def trajectory(eid: str, won: bool = False, turns: int = 3, env: str = "alfworld") -> Trajectory:
    rows = []
    for k in range(1, turns + 1):
        prompt = render_agent_prompt(TASK, f"obs {k}", ["look", "go to fridge 1"], k, [], 5)
        rows.append(
            Turn(step=k, observation=f"obs {k}", admissible=["look"], prompt=prompt, response=f"<action>a{k}</action>",
                 response_ids=[4 + k, 5 + k], action=f"a{k}", valid=True)
        )  # fmt: skip
    return Trajectory(
        episode_id=eid, group_id="g0", env=env, task_id="t0", split="train", category="pick_cool_then_place_in_recep",
        task=TASK, turns=rows, won=won, score=float(won), reward=10.0 * won, length=turns, engine="hf", model_id="m",
        model_hash="h", sampling={}, prompt_version="v", seed=0,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------- parse


def test_step_skills_valid_entries_are_kept_by_turn_index():
    text = answer(episode_skill=EPISODE_SKILL, step_skills={"1": STEP_SKILL, "Step 3": "Put the mug in the cabinet."})
    p = parse_skill(text, skill_mode="episode_step", steps=3, max_step_skills=5)
    assert p.kept and p.skill == EPISODE_SKILL
    # step numbers from 1 (as the analysis prompt shows them) -> turn indices from 0
    assert p.step_skills == {0: STEP_SKILL, 2: "Put the mug in the cabinet."}
    assert p.step_dropped == {}


def test_step_skills_out_of_range_and_malformed_entries_are_dropped_and_counted():
    table = {
        "0": "Step zero does not exist in the prompt.",
        "4": "Step four is past the end of the episode.",
        "two": "A step that is not named by a number.",
        "2": STEP_SKILL,
        "02": "The same step a second time, written differently.",
        "3": "<advice for that step>",
        "1": "Open it.",
    }
    p = parse_skill(answer(episode_skill=EPISODE_SKILL, step_skills=table), skill_mode="episode_step", steps=3,
                    max_step_skills=5)  # fmt: skip
    assert p.kept and p.step_skills == {1: STEP_SKILL}
    assert p.step_dropped == {
        STEP_OUT_OF_RANGE: 2, STEP_BAD_INDEX: 1, STEP_DUPLICATE: 1, STEP_PLACEHOLDER: 1, STEP_TOO_SHORT: 1,
    }  # fmt: skip
    # a step_skills that is not an object: the answer is kept (its episode skill is), no step skill
    q = parse_skill(answer(episode_skill=EPISODE_SKILL, step_skills=["x"]), skill_mode="episode_step", steps=3,
                    max_step_skills=5)  # fmt: skip
    assert q.kept and q.step_skills == {} and q.step_dropped == {STEP_NOT_OBJECT: 1}


def test_step_skills_over_the_cap_keep_the_first_in_the_answers_order():
    table = {"3": "Put the mug in the cabinet now.", "1": STEP_SKILL, "2": "Take the mug from the fridge."}
    p = parse_skill(answer(episode_skill=EPISODE_SKILL, step_skills=table), skill_mode="episode_step", steps=3,
                    max_step_skills=2)  # fmt: skip
    assert p.step_skills == {2: "Put the mug in the cabinet now.", 0: STEP_SKILL}
    assert p.step_dropped == {STEP_OVER_CAP: 1}


def test_step_only_keeps_the_answer_only_with_a_step_skill_and_episode_only_ignores_them():
    good = parse_skill(answer(step_skills={"2": STEP_SKILL}), skill_mode="step_only", steps=2, max_step_skills=2)
    assert good.kept and good.skill is None and good.step_skills == {1: STEP_SKILL}
    none = parse_skill(answer(step_skills={"9": STEP_SKILL}), skill_mode="step_only", steps=2, max_step_skills=2)
    assert not none.kept and none.reason == MISSING_STEP_SKILLS and none.step_dropped == {STEP_OUT_OF_RANGE: 1}
    # the template's echo first, then the real object: the first kept one wins
    echo = '{"episode_summary": "<two sentences on what happened>", "step_skills": {"<step number>": "<advice>"}}'
    both = parse_skill(echo + "\n" + answer(step_skills={"1": STEP_SKILL}), skill_mode="step_only", steps=1,
                       max_step_skills=1)  # fmt: skip
    assert both.kept and both.step_skills == {0: STEP_SKILL}
    # episode_step: a rejected episode skill rejects the answer; its step skills are parsed (for the dump) only
    short = parse_skill(answer(episode_skill="Open it.", step_skills={"1": STEP_SKILL}), skill_mode="episode_step",
                        steps=1, max_step_skills=1)  # fmt: skip
    assert short.reason == TOO_SHORT and short.step_skills == {0: STEP_SKILL}
    # episode_only: exactly the old parse, no step skills
    old = parse_skill(answer(episode_skill=EPISODE_SKILL, step_skills={"1": STEP_SKILL}))
    assert old.kept and old.step_skills == {} and old.skill == EPISODE_SKILL


# --------------------------------------------------------------------------------------------- prompts


TURNS = [{"observation": "o1", "response": "r1", "valid": True}, {"observation": "o2", "response": "r2", "valid": True}]
HEAD = (
    "You are an expert analyst of embodied agents in the ALFRED household environment (ALFWorld). Read the episode "
    "below and extract {goal}.\n\nTask: find a mug.\nOutcome: SUCCESS after 2 step(s).\n\nEpisode:\n"
    "Step 1\nObservation: o1\nAgent response (valid): r1\n\nStep 2\nObservation: o2\nAgent response (valid): r2\n\n"
)
STEP_REQUEST = (
    "at most 2 critical step(s) of the episode and write a step skill for each: one short imperative sentence of "
    "advice the agent can act on at that step, inferred from the whole episode; policy-facing, not a retrospective. "
    "Name each step by its number above.\nAnswer with JSON only, exactly this object and nothing else:\n"
)


def test_analysis_prompt_asks_for_step_skills_per_mode():
    def render(mode: str, cap: int = 5) -> str:
        return render_analysis_prompt("find a mug.", True, TURNS, description=ALFWORLD_ANALYSIS_DESCRIPTION,
                                      skill_mode=mode, max_step_skills=cap)  # fmt: skip

    episode_goal = "one hindsight skill the agent should use next time it faces this kind of task"
    workflow = (
        "Write the skill as one short, policy-facing rule, not a retrospective. The episode succeeded: state the "
        "reusable workflow — the core decision rule and the order of the key actions.\n"
    )
    assert render("episode_only") == HEAD.format(goal=episode_goal) + workflow + (
        "Answer with JSON only, exactly this object and nothing else:\n"
        '{"episode_summary": "<two sentences on what happened>", "episode_skill": "<the rule>"}'
    )
    assert render("episode_only") == render_analysis_prompt(
        "find a mug.", True, TURNS, description=ALFWORLD_ANALYSIS_DESCRIPTION
    )  # the default is the analysis-v1 text
    # the cap is min(max_step_skills, steps): 2 of 5 here
    assert render("episode_step") == HEAD.format(goal=episode_goal) + workflow + "Also pick " + STEP_REQUEST + (
        '{"episode_summary": "<two sentences on what happened>", "episode_skill": "<the rule>", '
        '"step_skills": {"<step number>": "<advice for that step>"}}'
    )
    assert render("step_only") == HEAD.format(goal="hindsight skills for its critical steps") + "Pick " + (
        STEP_REQUEST + '{"episode_summary": "<two sentences on what happened>", '
        '"step_skills": {"<step number>": "<advice for that step>"}}'
    )
    assert "at most 1 critical step(s)" in render("step_only", cap=1)
    assert analysis_prompt_version(False, "episode_step") == "analysis-step-v1"
    assert analysis_prompt_version(True, "episode_only") == "analysis-visual-v1"


def test_step_skill_goes_before_the_turn_line_and_episode_skill_after_the_task_line():
    prompt = render_agent_prompt(TASK, "You are in a room.", ["look"], 1, [], 5)
    task_line = f"You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {TASK}\n"
    assert prompt.startswith(task_line)
    episode = ALFWORLD.insert_skill(prompt, EPISODE_SKILL)
    assert episode == prompt.replace(
        task_line,
        task_line + "\n## Episode-Level Skill\nUse the following skill, learned in hindsight from this kind of task, "
        f"to choose your actions.\n{EPISODE_SKILL}\n\n",
    )
    step = ALFWORLD.insert_step_skill(prompt, STEP_SKILL)
    assert step == prompt.replace(
        "\n\nNow it's your turn to take an action.\n",
        "\n\n## Critical-Step Skill\nUse this current-step skill for this decision only.\n"
        f"{STEP_SKILL}\n\nNow it's your turn to take an action.\n",
    )
    assert step != prompt
    # a prompt without the turn line (EZPoints): the block goes at the end, as the SEED code appends it
    assert insert_step_skill("Cards: <image>\nAnswer now.\n", STEP_SKILL) == (
        f"Cards: <image>\nAnswer now.\n\n## Critical-Step Skill\nUse this current-step skill for this decision only.\n"
        f"{STEP_SKILL}"
    )


# --------------------------------------------------------------------------------------------- teacher prompts


def _samples(mode: str, skills, steps, **kw):
    eps = [trajectory("e0"), trajectory("e1")]
    return eps, build_turn_samples(
        eps, skills, None, insert_skill=ALFWORLD.insert_skill, insert_step_skill=ALFWORLD.insert_step_skill,
        skill_mode=mode, step_skills=steps, **kw,
    )  # fmt: skip


def test_each_turn_gets_the_skill_the_official_code_gives_it():
    steps = [{1: STEP_SKILL}, {0: STEP_SKILL}]
    eps, only = _samples("episode_only", [EPISODE_SKILL, None], steps)
    episode_prompts = [ALFWORLD.insert_skill(t.prompt, EPISODE_SKILL) for t in eps[0].turns]
    assert [s.skill_prompt for s in only] == [*episode_prompts, None, None, None]
    assert not any(s.step_skill for s in only)

    # episode_step (step_priority): turn 2 has a step skill and gets it alone; the other turns the episode skill;
    # episode 1 has no episode skill, so its step skill is not used either (its analysis did not succeed)
    eps, both = _samples("episode_step", [EPISODE_SKILL, None], steps)
    step_prompt = ALFWORLD.insert_step_skill(eps[0].turns[1].prompt, STEP_SKILL)
    assert EPISODE_SKILL not in step_prompt and STEP_SKILL in step_prompt
    assert [s.skill_prompt for s in both] == [episode_prompts[0], step_prompt, episode_prompts[2], None, None, None]
    assert [s.step_skill for s in both] == [False, True, False, False, False, False]
    assert [s.has_skill for s in both] == [True, True, True, False, False, False]

    # step_only: only the turns with a step skill have a teacher prompt; the others have no OPD
    eps, step_only = _samples("step_only", [None, None], steps)
    assert [s.skill_prompt for s in step_only] == [
        None, step_prompt, None, ALFWORLD.insert_step_skill(eps[1].turns[0].prompt, STEP_SKILL), None, None,
    ]  # fmt: skip
    assert [s.has_skill for s in step_only] == [False, True, False, True, False, False]
    # the advantages do not depend on the skills
    assert [s.advantage for s in step_only] == [s.advantage for s in only]


def test_contrast_and_no_teacher_pass_with_step_skills():
    _, samples = _samples("episode_step", [EPISODE_SKILL, "Another skill of the same kind here."], [{1: STEP_SKILL}, None],
                          contrast_skills=["OTHER skill text.", None])  # fmt: skip
    # opd_contrast: a step-skill turn keeps its plain gate (no other episode's step skill to contrast with)
    assert [s.contrast_prompt is not None for s in samples] == [True, False, True, False, False, False]
    _, off = _samples("episode_step", [EPISODE_SKILL, None], [{1: STEP_SKILL}, None], with_skill_context=False)
    assert not any(s.has_skill or s.step_skill for s in off)  # λ_opd = 0 this update: no teacher prompt at all


# --------------------------------------------------------------------------------------------- the analyzer


class ScriptedEngine:
    """`render` and `generate` of an engine: the k-th generate call answers `script[k]` to every prompt."""

    def __init__(self, script: list[str]):
        self.script = script
        self.calls: list[list[list[dict]]] = []
        self._rendered: list[list[dict]] = []

    def render(self, messages):
        self._rendered.append(messages)
        return [len(self._rendered) - 1]

    def generate(self, prompts, temperature, top_p, max_new_tokens, seed):
        self.calls.append([self._rendered[ids[0]] for ids in prompts])
        return [Completion(self.script[len(self.calls) - 1], [1], [0.0], "stop") for _ in prompts]


def test_lockstep_analysis_carries_step_skills_to_the_batch():
    good = answer(episode_skill=EPISODE_SKILL, step_skills={"2": STEP_SKILL, "7": "Out of range step advice here."})
    engine = ScriptedEngine(["not json", good])
    cfg = RLConfig(skill_mode="episode_step", max_step_skills=3)
    ctx = SimpleNamespace(cfg=cfg, plan=Plan("self", None, 0.01, 5.0), engine=engine, info=DistInfo(), images=None)
    eps = [trajectory("e0"), trajectory("e1", turns=2)]
    analyses: dict = {}
    skills, reasons = analyse(ctx, eps, 1, analyses)
    assert skills == [EPISODE_SKILL, EPISODE_SKILL] and reasons == [None, None]
    assert analyses["e0"].step_skills == {1: STEP_SKILL} and analyses["e0"].attempts == 2
    assert analyses["e0"].step_dropped == {STEP_OUT_OF_RANGE: 1}
    asked = engine.calls[0][0][0]["content"]
    assert analyses["e0"].prompt == asked and "Also pick at most 3 critical step(s)" in asked
    assert "at most 2 critical step(s)" in engine.calls[0][1][0]["content"]  # e1 has two steps
    assert engine.calls[1][0][2]["content"] == STEP_SCHEMA_REMINDER  # the retry's reminder names step_skills
    batch = gather_episodes(eps, skills, reasons, DistInfo(), analyses)
    assert batch.step_skills == [{1: STEP_SKILL}, {1: STEP_SKILL}]
    assert Batch(eps, skills, reasons).step_skills == [None, None]  # without analyses: no step skills


def test_in_rollout_analysis_carries_step_skills():
    engine = ScriptedEngine([])
    analysis = SelfAnalysis(engine, 64, attempts=2, skill_mode="step_only", max_step_skills=1)
    (request,) = analysis.first(trajectory("e0", turns=2))
    assert "Pick at most 1 critical step(s)" in engine._rendered[0][0]["content"]
    (retry,) = analysis.land(request.tag, Completion(answer(step_skills={"5": STEP_SKILL}), [1], [0.0], "stop"))
    assert engine._rendered[1][2]["content"] == STEP_ONLY_SCHEMA_REMINDER
    assert analysis.land(retry.tag, Completion(answer(step_skills={"2": STEP_SKILL}), [1], [0.0], "stop")) == []
    parsed = analysis.results["e0"]
    assert parsed.kept and parsed.skill is None and parsed.step_skills == {1: STEP_SKILL} and parsed.attempts == 2


# --------------------------------------------------------------------------------------------- rescore and metrics


class CharEngine:
    tokenizer = SimpleNamespace(pad_token_id=0)

    def render(self, messages):
        return [2 + ord(ch) % 95 for ch in messages[0]["content"]][-300:]


def test_rescore_scores_step_prompts_and_guards_step_skills():
    eps = [trajectory("e0"), trajectory("e1")]
    parsed = {
        "e0": parse_skill(answer(step_skills={"1": STEP_SKILL, "3": "Put the mug in cabinet 4 now."}),
                          skill_mode="step_only", steps=3, max_step_skills=2),
        "e1": parse_skill("junk", skill_mode="step_only", steps=3, max_step_skills=2),
    }  # fmt: skip
    batch = gather_episodes(eps, [None, None], [None, parsed["e1"].reason], DistInfo(), parsed)

    # the leak rule finds "cabinet 4" in the second step skill: drop removes that step skill only
    def leaks(episodes, texts):
        return [[(t.find("cabinet 4"), t.find("cabinet 4") + 9)] if t and "cabinet 4" in t else [] for t in texts]

    assert guard_step_skills(eps, batch.step_skills, leaks, "drop") == ([{0: STEP_SKILL}, None], 1)
    hooks = EnvHooks(insert_skill=ALFWORLD.insert_skill, insert_step_skill=ALFWORLD.insert_step_skill, find_leaks=leaks)
    ctx = SimpleNamespace(
        cfg=RLConfig(skill_mode="step_only", leak_guard="drop", mini_batch=8), info=DistInfo(), engine=CharEngine(),
        plan=Plan("self", None, 0.01, 5.0), hooks=hooks,
        models=SimpleNamespace(train_model=Scorer(tiny_lm(0, vocab=97)), ref_model=None), pad_id=0,
        vision_processor=None, padding_ids=lambda: None,
    )  # fmt: skip
    scored = rescore(ctx, batch, step=1, weights=LossWeights(opd_coef=0.01))
    assert scored.leak_guarded == 1
    with_skill = [(s.episode_index, s.turn_index) for s in scored.samples if s.has_skill]
    assert with_skill == [(0, 0)]  # only e0's first turn: its third turn's step skill leaked, e1 has none
    (s,) = [s for s in scored.samples if s.has_skill]
    assert s.skill_logp is not None and s.skill_logp.shape == (2,)
    assert all(t.skill_logp is None for t in scored.samples if not t.has_skill)
    metrics = step_skill_metrics(batch, scored.samples)
    assert metrics == {"skills/step_skills": 2.0, "opd/step_skill_turn_frac": 1 / 6}


# --------------------------------------------------------------------------------------------- config


def test_config_defaults_hash_and_errors():
    base = build_config("rl")
    assert (base.skill_mode, base.max_step_skills, base.dump_analyses) == ("episode_only", 5, False)
    assert [build_config("rl", overrides=[f"env={e}"]).max_step_skills for e in ("webshop", "search", "ezpoints")] == [
        5, 2, 0,
    ]  # fmt: skip
    # episode_only: the new fields do not enter the hash (max_step_skills has no effect there)
    for overrides in (["skill_mode=episode_only"], ["max_step_skills=3"], ["dump_analyses=true"]):
        assert build_config("rl", overrides=overrides).config_hash() == base.config_hash(), overrides
    search = build_config("rl", overrides=["env=search"])
    assert "max_step_skills" not in search.hashed()
    step = build_config("rl", overrides=["skill_mode=episode_step"])
    assert step.config_hash() != base.config_hash()
    assert build_config("rl", overrides=["skill_mode=episode_step", "max_step_skills=3"]).config_hash() != (
        step.config_hash()
    )
    with pytest.raises(UserError, match="field 'skill_mode': episode_step needs step skills.*--analyzer self"):
        build_config("rl", overrides=["analyzer=static:data/static_skills.json", "skill_mode=episode_step"])
    with pytest.raises(UserError, match="--algo sdar gives episode skills only"):
        build_config("rl", overrides=["algo=sdar", "skill_mode=step_only"])
    with pytest.raises(UserError, match="field 'max_step_skills': 0 with skill_mode step_only"):
        build_config("rl", overrides=["env=ezpoints", "skill_mode=step_only"])
    assert build_config("rl", overrides=["algo=grpo", "skill_mode=step_only"]).skill_mode == "step_only"


# --------------------------------------------------------------------------------------------- dumps


def test_dumps_hold_the_analyses_and_the_teacher_prompts(tmp_path):
    eps = [trajectory("e0", won=True), trajectory("e1")]
    text = answer(episode_skill=EPISODE_SKILL, step_skills={"2": STEP_SKILL, "9": "A step that is out of range."})
    parsed = parse_skill(text, skill_mode="episode_step", steps=3, max_step_skills=2)
    parsed.prompt = "the analysis prompt"
    batch = gather_episodes(eps, [EPISODE_SKILL, None], [None, "analyzer_off"], DistInfo(), {"e0": parsed})
    _, samples = _samples("episode_step", batch.skills, batch.step_skills)
    ctx = SimpleNamespace(cfg=RLConfig(skill_mode="episode_step", dump_analyses=True), info=DistInfo(),
                          run_dir=tmp_path, plan=Plan("self", None, 0.01, 5.0))  # fmt: skip
    scored = Rescored(samples, [], [], {}, 0.0, 0.0, 0)
    analyses_file, prompts_file = write_dumps(ctx, 7, batch, scored)
    assert analyses_file == tmp_path / "analyses" / "step_000007.jsonl"
    rows = [json.loads(line) for line in analyses_file.read_text().splitlines()]
    assert [r["episode_id"] for r in rows] == ["e0", "e1"]
    assert {k: rows[0][k] for k in (
        "step", "category", "won", "prompt", "answer", "episode_skill", "step_skills", "step_dropped", "reason",
        "prompt_version",
    )} == {
        "step": 7, "category": "pick_cool_then_place_in_recep", "won": True, "prompt": "the analysis prompt",
        "answer": text, "episode_skill": EPISODE_SKILL, "step_skills": {"2": STEP_SKILL},
        "step_dropped": {STEP_OUT_OF_RANGE: 1}, "reason": None, "prompt_version": "analysis-step-v1",
    }  # fmt: skip
    assert rows[1]["prompt"] is None and rows[1]["reason"] == "analyzer_off" and rows[1]["step_skills"] == {}
    prompts = [json.loads(line) for line in prompts_file.read_text().splitlines()]
    assert prompts_file == tmp_path / "teacher_prompts" / "step_000007.jsonl"
    assert [(p["episode_id"], p["turn"], p["source"]) for p in prompts] == [
        ("e0", 1, "episode"), ("e0", 2, "step"), ("e0", 3, "episode"),
    ]  # fmt: skip
    assert prompts[1]["teacher_prompt"] == ALFWORLD.insert_step_skill(eps[0].turns[1].prompt, STEP_SKILL)
    ctx.cfg = RLConfig(skill_mode="episode_step")  # dump_analyses off: nothing written
    assert write_dumps(ctx, 8, batch, scored) == [] and not (tmp_path / "analyses" / "step_000008.jsonl").exists()
