"""A skill that never reaches the teacher is caught (issue 54 §5; SDAR #35 lost 7.8 ALFWorld points to a skill that
never loaded, and no loss test saw it).

A real tokenizer and model, SmolLM2-135M-Instruct, on expert-played EZPoints games: the teacher prompts `seed rl`
builds (`rl/samples.py: build_turn_samples` with the environment's `insert_skill`, scored by `rl/rescore.py:
rescore_samples`) must score the expert's action tokens higher with each game's own oracle skill (its card values and
formula) than with another game's oracle, by more than MARGIN nats a token on average. A skill truncated away,
attached to the wrong episode, or placed after the reply leaves (almost) no margin, and each is done here on purpose.

MARGIN, from `seed probe` on 64 expert-played test games with this model (docs/method-check.md, "Does the skill
teach?": the oracle raised the action tokens by +0.79 nats over the ordinary prompt against +0.18 for another game's
oracle: a margin of 0.61 nats): half of the measured margin, so rounding or a different CPU cannot flip it while a
lost skill (measured margin 0) cannot pass.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

MARGIN = 0.30
GAMES = 12


def _expert_episodes(env, tokenizer):
    """GAMES expert-played EZPoints test games as the records rl reads (prompt, tokenised reply, action per turn)."""
    from types import SimpleNamespace as NS

    episodes = []
    for task in env.list_tasks("test")[:GAMES]:
        game = env.new_game(expert=True)
        result, turns = game.reset(task), []
        while not result.done and result.expert_action and len(turns) < env.max_steps:
            prompt = env.render_prompt(result.task, result.observation, result.admissible, len(turns) + 1, [], 0)
            reply = env.expert_response(result)
            action, valid = env.parse_action(reply)
            ids = tokenizer.encode(reply, add_special_tokens=False)
            turns.append(NS(prompt=prompt, response=reply, response_ids=ids, action=action, valid=valid,
                            observation=result.observation, image=None))  # fmt: skip
            result = game.step(action)
        assert result.won
        episodes.append(NS(episode_id=task.task_id, group_id=task.task_id, task_id=task.task_id, split="test",
                           category=task.category, task=result.task, won=True, turns=turns))  # fmt: skip
    return episodes


@pytest.fixture(scope="module")
def setup(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seedcli.engines.base import render_chat
    from seedcli.envs import get_env
    from seedcli.rl.logprobs import Scorer

    env = get_env("ezpoints")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    episodes = _expert_episodes(env, tokenizer)
    render = lambda text: render_chat(tokenizer, [{"role": "user", "content": text}])  # noqa: E731
    return env, tokenizer, Scorer(model), episodes, render


def _action_logp(setup, skills, insert_skill=None, after_reply: bool = False) -> torch.Tensor:
    """ℓ_skill of every action token of the episodes, through rl's own sample building and re-scoring."""
    from seedcli.rl.rescore import rescore_samples
    from seedcli.rl.samples import build_turn_samples
    from seedcli.stages.probe import action_mask

    env, tokenizer, scorer, episodes, render = setup
    samples = build_turn_samples(episodes, skills, render, insert_skill=insert_skill or env.insert_skill)
    owners = [(e, t) for e, ep in enumerate(episodes) for t in ep.turns]
    turns = [t for _, t in owners]
    if after_reply:  # the skill's tokens after the reply: what the reply's tokens can attend to is the plain prompt
        for s, (e, t) in zip(samples, owners, strict=True):
            s.skill_prompt_ids = s.prompt_ids
            s.response_ids = list(t.response_ids) + tokenizer.encode(skills[e], add_special_tokens=False)
    rescore_samples(samples, old_fn=None, ref_fn=None, teacher_fn=scorer, teacher=True, max_tokens=8192,
                    pad_id=tokenizer.pad_token_id)  # fmt: skip
    out = []
    for s, t in zip(samples, turns, strict=True):
        mask = torch.tensor(action_mask(tokenizer, t.response_ids, t.action))
        out.append(s.skill_logp[: len(t.response_ids)][mask])
    return torch.cat(out)


def _margin(setup, oracle, shuffled, **bug) -> float:
    """Mean over the expert's action tokens of ℓ(own oracle) − ℓ(another game's oracle), both through one pipeline."""
    return float((_action_logp(setup, oracle, **bug) - _action_logp(setup, shuffled, **bug)).mean())


def test_the_oracle_skill_reaches_the_teacher_and_a_lost_one_is_caught(setup):
    from seedcli.rl.analyse import other_skills

    env, _, _, episodes, _ = setup
    oracle = [env.oracle_skill(ep) for ep in episodes]
    shuffled = other_skills(episodes, oracle, 0, other_task=True)
    assert all(oracle) and all(shuffled) and all(a != b for a, b in zip(oracle, shuffled, strict=True))
    margin = _margin(setup, oracle, shuffled)
    assert margin > MARGIN, f"the oracle raised the expert's action tokens by only {margin:.3f} nats over another's"

    # the same measurement with the skill lost on the way, three ways: each must fall below the margin
    lost = {
        "truncated away": _margin(setup, oracle, shuffled, insert_skill=lambda prompt, skill: prompt),
        "after the reply": _margin(setup, oracle, shuffled, after_reply=True),
        # each episode gets its neighbour's skill: both sides then read another game's oracle
        "wrong episode": _margin(setup, oracle[1:] + oracle[:1], shuffled[1:] + shuffled[:1]),
    }
    for name, value in lost.items():
        assert value < MARGIN, f"{name}: margin {value:.3f}"
