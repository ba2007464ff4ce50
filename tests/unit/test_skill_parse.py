"""The skill parser: what analyzers really write, and what is kept or rejected."""

import json

import pytest

from seedcli.analyzers import analysis_messages, request_key
from seedcli.analyzers.parse import (
    EMPTY,
    MISSING_SKILL,
    MISSING_SUMMARY,
    PLACEHOLDER,
    TOO_SHORT,
    UNPARSEABLE,
    is_placeholder,
    parse_skill,
)
from seedcli.envs.alfworld.prompt import ALFWORLD_ANALYSIS_DESCRIPTION
from seedcli.prompts import SCHEMA_REMINDER, render_analysis_prompt

SUMMARY = "The agent found the apple on the counter. It cleaned it and put it in the fridge."
SKILL = "Find the apple first, clean it at the sinkbasin, then move it to the fridge."


def test_bare_json_is_kept():
    p = parse_skill(json.dumps({"episode_summary": SUMMARY, "episode_skill": SKILL}))
    assert p.kept and p.summary == SUMMARY and p.skill == SKILL and p.reason is None


def test_fenced_json_with_prose_around_it():
    text = (
        f'Sure! Here is the JSON:\n```json\n{{"episode_summary": "{SUMMARY}", "episode_skill": "{SKILL}"}}\n```\nDone.'
    )
    p = parse_skill(text)
    assert p.kept and p.skill == SKILL


def test_unclosed_fence_from_a_truncated_answer_still_parses():
    text = f'```json\n{{"episode_summary": "{SUMMARY}", "episode_skill": "{SKILL}"}}\n'
    assert parse_skill(text).skill == SKILL


def test_trailing_commas_are_repaired():
    text = f'{{\n  "episode_summary": "{SUMMARY}",\n  "episode_skill": "{SKILL}",\n}}'
    assert parse_skill(text).kept


def test_raw_newlines_and_smart_quotes_inside_strings():
    text = '{"episode_summary": "line one\nline two", "episode_skill": “Go to the desk, take the pen, then use the desklamp.”}'
    p = parse_skill(text)
    assert p.kept
    assert p.summary == "line one line two"  # whitespace normalised
    assert p.skill == "Go to the desk, take the pen, then use the desklamp."


def test_regex_fallback_on_broken_json():
    # unbalanced: the closing brace never came
    text = f'{{"episode_summary": "{SUMMARY}", "episode_skill": "{SKILL}"'
    p = parse_skill(text)
    assert p.kept and p.skill == SKILL


def test_prose_fallback_with_labelled_lines():
    text = f"**Episode summary:** {SUMMARY}\n**Episode skill:** {SKILL}"
    p = parse_skill(text)
    assert p.kept and p.skill == SKILL and p.summary == SUMMARY


def test_template_echo_then_real_answer_keeps_the_real_one():
    echo = '{"episode_summary": "<two sentences on what happened>", "episode_skill": "<the rule>"}'
    real = json.dumps({"episode_summary": SUMMARY, "episode_skill": SKILL})
    assert parse_skill(echo + "\n" + real).skill == SKILL


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", EMPTY),
        ("   \n", EMPTY),
        ("I cannot analyse this episode.", UNPARSEABLE),
        ('{"episode_summary": "x", episode_skill: oops', MISSING_SKILL),
        (json.dumps({"episode_summary": SUMMARY}), MISSING_SKILL),
        (json.dumps({"episode_summary": SUMMARY, "episode_skill": ""}), MISSING_SKILL),
        (json.dumps({"episode_summary": SUMMARY, "episode_skill": 42}), MISSING_SKILL),
        (json.dumps({"episode_skill": SKILL}), MISSING_SUMMARY),
        (json.dumps({"episode_summary": SUMMARY, "episode_skill": "Be careful next time."}), TOO_SHORT),
        (json.dumps({"episode_summary": SUMMARY, "episode_skill": "<the rule>"}), PLACEHOLDER),
        (json.dumps({"episode_summary": SUMMARY, "episode_skill": "..."}), PLACEHOLDER),
        (json.dumps({"episode_summary": SUMMARY, "episode_skill": "N/A"}), PLACEHOLDER),
        (json.dumps({"episode_summary": SUMMARY, "episode_skill": "None"}), PLACEHOLDER),
    ],
)
def test_rejections_carry_a_reason(text, reason):
    p = parse_skill(text)
    assert not p.kept
    assert p.reason == reason
    assert p.raw == text


def test_five_words_is_the_threshold():
    four = json.dumps({"episode_summary": SUMMARY, "episode_skill": "Open the fridge first."})
    five = json.dumps({"episode_summary": SUMMARY, "episode_skill": "Open the fridge door first."})
    assert parse_skill(four).reason == TOO_SHORT
    assert parse_skill(five).kept


def test_placeholder_detection_leaves_real_rules_alone():
    assert is_placeholder("<the rule>") and is_placeholder("…") and is_placeholder("none.")
    assert not is_placeholder("None of the cabinets hold the mug: check the countertops first.")
    assert not is_placeholder("[Search] go to each countertop, then take the mug.")


def test_the_template_answer_itself_is_rejected():
    # the exact object the analysis prompt shows as the expected shape
    prompt = render_analysis_prompt(
        "put a clean cloth in bathtubbasin.", True, [], description=ALFWORLD_ANALYSIS_DESCRIPTION
    )
    template = prompt[prompt.index("{") :]
    assert parse_skill(template).reason == PLACEHOLDER


def test_retry_conversation_and_request_key():
    msgs = analysis_messages("PROMPT", previous_answer="garbage")
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == "garbage" and msgs[2]["content"] == SCHEMA_REMINDER
    assert analysis_messages("PROMPT") == [{"role": "user", "content": "PROMPT"}]
    k = request_key("glm", "glm-5.2", "analysis-v1", "PROMPT", 0.0, 4096)
    assert k == request_key("glm", "glm-5.2", "analysis-v1", "PROMPT", 0.0, 4096)
    assert k != request_key("glm", "glm-5.2", "analysis-v2", "PROMPT", 0.0, 4096)
    assert k != request_key("openai", "glm-5.2", "analysis-v1", "PROMPT", 0.0, 4096)
    assert k != request_key("glm", "glm-5.2", "analysis-v1", "PROMPT!", 0.0, 4096)
    assert len(k) == 64
