import pytest

from seedcli.envs.alfworld.projection import format_response, parse_action
from seedcli.envs.alfworld.prompt import (
    ALFWORLD_ANALYSIS_DESCRIPTION,
    TASK_LINE_PREFIX,
    insert_skill,
    render_agent_prompt,
)
from seedcli.prompts import SKILL_HEADING, SKILL_INSTRUCTION, insert_after_line, render_analysis_prompt


def test_first_turn_has_no_history_and_drops_help():
    p = render_agent_prompt("put a mug in sinkbasin.", "You are in a room.", ["look", "help", "go to desk 1"], 1, [], 5)
    assert "Prior to this step" not in p
    assert "'help'" not in p
    assert "'look', 'go to desk 1'" in p
    assert p.startswith("You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put")
    assert "<think> </think>" in p and "<action> </action>" in p


def test_history_shows_only_the_last_n_pairs_with_their_step_numbers():
    history = [(f"obs {i}", f"act {i}") for i in range(1, 8)]
    p = render_agent_prompt("t", "now", ["look"], 8, history, 5)
    assert "already taken 7 step(s)" in p and "most recent 5 observations" in p
    assert "[Observation 3: 'obs 3', Action 3: 'act 3']" in p
    assert "obs 2'" not in p
    assert "You are now at step 8" in p


def test_parse_action_validity_rules():
    assert parse_action("<think>x</think><action>Go To Desk 1 </action>") == ("go to desk 1", True)
    assert parse_action("<action>look</action>") == ("look", False)  # no think tag
    assert parse_action("<think>x</think><action>  </action>") == ("", False)  # empty action
    assert parse_action("<think>x</think> look") == ("", False)
    action, valid = parse_action(format_response("because", "take apple 1 from countertop 1"))
    assert (action, valid) == ("take apple 1 from countertop 1", True)


def test_skill_block_goes_right_after_the_task_line():
    p = render_agent_prompt("put a mug in sinkbasin.", "obs", ["look"], 1, [], 5)
    s = insert_skill(p, "Find the mug first, then go to the sinkbasin.")
    lines = s.splitlines()
    task_i = next(i for i, line in enumerate(lines) if TASK_LINE_PREFIX in line)
    assert lines[task_i + 2] == "## Episode-Level Skill"
    assert lines[task_i + 4] == "Find the mug first, then go to the sinkbasin."
    block = f"\n## {SKILL_HEADING}\n{SKILL_INSTRUCTION}\nFind the mug first, then go to the sinkbasin.\n\n"
    assert s.replace(block, "", 1) == p  # nothing else in the prompt changes


def test_analysis_prompt_truncates_oldest_steps_first():
    turns = [{"observation": f"o{i} " * 50, "response": "r", "valid": i % 2 == 0} for i in range(10)]
    full = render_analysis_prompt("task", False, turns, description=ALFWORLD_ANALYSIS_DESCRIPTION)
    assert "INVALID" in full and "FAILURE" in full and "avoidance rule" in full
    short = render_analysis_prompt(
        "task", False, turns, max_chars=len(full) // 2, description=ALFWORLD_ANALYSIS_DESCRIPTION
    )
    assert len(short) <= len(full) // 2
    assert "earlier step(s) omitted" in short
    assert "o9" in short and "o0 " not in short


def test_analysis_prompt_opens_with_the_description_it_is_handed():
    turns = [{"observation": "o", "response": "r", "valid": True}]
    text = render_analysis_prompt("task", True, turns, description="You are an expert analyst of test agents.")
    assert text.startswith("You are an expert analyst of test agents. Read the episode below")
    assert "ALFRED" not in text
    with pytest.raises(TypeError):  # no environment's description is assumed
        render_analysis_prompt("task", True, turns)  # type: ignore[call-arg]


def test_skill_block_after_any_task_line_and_a_missing_one_is_an_error():
    assert insert_after_line("Q: why?\nrest", "Q: ", "Think.") == (
        f"Q: why?\n\n## {SKILL_HEADING}\n{SKILL_INSTRUCTION}\nThink.\n\nrest"
    )
    with pytest.raises(ValueError, match="no task line"):
        insert_after_line("no such line", "Your task is to: ", "x")
