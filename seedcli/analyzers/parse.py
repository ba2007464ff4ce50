"""Skill parsing: the analyzer's raw answer → (episode_summary, episode_skill), or the reason it is rejected.

Tolerant on purpose, because analyzers (an API model, a small local policy) wrap JSON in prose or code fences, leave
trailing commas, or stop mid-object: fenced or bare JSON → trailing-comma repair → a field-by-field regex fallback.
Strict on what is kept: both fields present, and the skill has at least `min_words` words (default five; `seed rl`'s
`min_skill_words`) and is not a placeholder.

Step skills (`seed rl --skill_mode episode_step | step_only`, the SEED code's `step_skills`): an object from step
number (as the analysis prompt shows it, from 1) to one sentence of advice. Each entry is judged on its own: one
with a bad step number, a step outside the episode, a placeholder or too few words is dropped and counted by reason
(`ParsedSkill.step_dropped`), and entries beyond `max_step_skills` are dropped in the answer's order, as the SEED code
keeps the first ones. episode_step keeps the answer when its episode skill is kept (the step skills ride along);
step_only keeps it when at least one step skill survives.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

MIN_SKILL_WORDS = 5

# Stable rejection reasons (manifest metrics count them; rejected.jsonl stores them).
EMPTY = "empty_response"
UNPARSEABLE = "unparseable"
MISSING_SUMMARY = "missing_summary"
MISSING_SKILL = "missing_skill"
TOO_SHORT = "skill_too_short"
PLACEHOLDER = "placeholder_skill"
SKIPPED_SUCCESS = "skipped_success"  # not a rejection: `analyze: failed` does not analyse a won episode
MISSING_STEP_SKILLS = "missing_step_skills"  # step_only: no usable step skill

# Why a step-skill entry was dropped (the answer itself may still be kept).
STEP_NOT_OBJECT = "step_skills_not_an_object"
STEP_BAD_INDEX = "step_bad_index"
STEP_OUT_OF_RANGE = "step_out_of_range"
STEP_DUPLICATE = "step_duplicate"
STEP_PLACEHOLDER = "step_placeholder"
STEP_TOO_SHORT = "step_skill_too_short"
STEP_OVER_CAP = "step_over_cap"

SUMMARY_KEYS = ("episode_summary", "summary")
SKILL_KEYS = ("episode_skill", "skill")
STEP_KEYS = ("step_skills", "step_skill")

# Text the analysis template itself shows (prompts.py) and the usual fillers a model writes when it has nothing.
_PLACEHOLDERS = {
    "",
    "...",
    "…",
    "n/a",
    "na",
    "none",
    "null",
    "nil",
    "tbd",
    "todo",
    "skill",
    "rule",
    "the rule",
    "episode skill",
    "episode_skill",
    "your skill here",
    "your rule here",
    "insert skill here",
    "two sentences on what happened",
    "one short, policy-facing rule",
    "one short policy-facing rule",
}

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|javascript|js)?[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")
_STEP_NUMBER = re.compile(r"(?:step\s*)?(\d+)", re.IGNORECASE)
_STEP_TABLE = re.compile(r"[\"']?step[_ ]skills[\"']?\s*:\s*(?=\{)", re.IGNORECASE)


@dataclass
class ParsedSkill:
    """One parse result. `reason` is None when the skill is kept."""

    summary: str | None
    skill: str | None
    reason: str | None
    raw: str = ""
    attempts: int = 1
    step_skills: dict[int, str] = field(default_factory=dict)  # turn index (from 0) -> step skill
    step_dropped: dict[str, int] = field(default_factory=dict)  # step-skill entries dropped, by reason
    prompt: str = ""  # the analysis prompt answered (set by the callers that render it)

    @property
    def kept(self) -> bool:
        return self.reason is None


def parse_skill(
    text: str | None,
    min_words: int = MIN_SKILL_WORDS,
    *,
    skill_mode: str = "episode_only",
    steps: int = 0,
    max_step_skills: int = 0,
) -> ParsedSkill:
    """Parse an analyzer answer and decide whether the skill is kept (see the module docstring); a skill of fewer than
    `min_words` words is `skill_too_short`. When the answer holds several objects (say, an echo of the template and
    then the real one), the first kept one wins. `skill_mode` other than episode_only also reads the step skills of
    an episode of `steps` turns, at most `max_step_skills` of them."""
    raw = text or ""
    if not raw.strip():
        return ParsedSkill(None, None, EMPTY, raw)
    if skill_mode != "episode_only":
        return _parse_with_steps(raw, min_words, skill_mode, steps, max_step_skills)
    results = [_judge(s, k, raw, min_words) for s, k in _json_field_pairs(raw)]
    if not results or not any(r.kept for r in results):
        summary, skill = _regex_fields(raw)
        if summary is not None or skill is not None:
            results.append(_judge(summary, skill, raw, min_words))
    if not results:
        return ParsedSkill(None, None, UNPARSEABLE, raw)
    return next((r for r in results if r.kept), results[0])


def _judge(summary: str | None, skill: str | None, raw: str, min_words: int = MIN_SKILL_WORDS) -> ParsedSkill:
    summary = _clean(summary)
    skill = _clean(skill)
    if not skill:
        return ParsedSkill(summary, None, MISSING_SKILL, raw)
    if not summary:
        return ParsedSkill(None, skill, MISSING_SUMMARY, raw)
    if is_placeholder(skill):
        return ParsedSkill(summary, skill, PLACEHOLDER, raw)
    if len(_WORD.findall(skill)) < min_words:
        return ParsedSkill(summary, skill, TOO_SHORT, raw)
    return ParsedSkill(summary, skill, None, raw)


def _parse_with_steps(raw: str, min_words: int, skill_mode: str, steps: int, cap: int) -> ParsedSkill:
    tables = [(_pick(obj, SUMMARY_KEYS), _pick(obj, SKILL_KEYS), _pick_table(obj)) for obj in _json_objects(raw)]
    results = [_judge_steps(*fields, raw, min_words, skill_mode, steps, cap) for fields in tables]
    if not any(r.kept for r in results):
        summary, skill = _regex_fields(raw)
        table = _regex_step_table(raw)
        if summary is not None or skill is not None or table is not None:
            results.append(_judge_steps(summary, skill, table, raw, min_words, skill_mode, steps, cap))
    if not results:
        return ParsedSkill(None, None, UNPARSEABLE, raw)
    return next((r for r in results if r.kept), results[0])


def _judge_steps(
    summary: str | None,
    skill: str | None,
    table: object,
    raw: str,
    min_words: int,
    skill_mode: str,
    steps: int,
    cap: int,
) -> ParsedSkill:
    step_skills, dropped = judge_step_skills(table, steps, cap, min_words)
    if skill_mode == "step_only":
        summary = _clean(summary)
        reason = MISSING_STEP_SKILLS if not step_skills else (None if summary else MISSING_SUMMARY)
        return ParsedSkill(summary, None, reason, raw, step_skills=step_skills, step_dropped=dropped)
    parsed = _judge(summary, skill, raw, min_words)
    parsed.step_skills, parsed.step_dropped = step_skills, dropped
    return parsed


def judge_step_skills(table: object, steps: int, cap: int, min_words: int) -> tuple[dict[int, str], dict[str, int]]:
    """(turn index from 0 -> step skill, dropped entries by reason) of an answer's `step_skills` object, whose keys
    are step numbers from 1 (a key may read "3" or "Step 3"); the first `cap` usable entries are kept."""
    if table is None:
        return {}, {}
    if not isinstance(table, dict):
        return {}, {STEP_NOT_OBJECT: 1}
    kept: dict[int, str] = {}
    dropped: Counter[str] = Counter()
    for key, value in table.items():
        match = _STEP_NUMBER.fullmatch(str(key).strip())
        number = int(match.group(1)) if match else None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = " ".join(value)
        text = _clean(value) if isinstance(value, str) else None
        if number is None:
            dropped[STEP_BAD_INDEX] += 1
        elif not 1 <= number <= steps:
            dropped[STEP_OUT_OF_RANGE] += 1
        elif number - 1 in kept:
            dropped[STEP_DUPLICATE] += 1
        elif not text or is_placeholder(text):
            dropped[STEP_PLACEHOLDER] += 1
        elif len(_WORD.findall(text)) < min_words:
            dropped[STEP_TOO_SHORT] += 1
        elif len(kept) >= cap:
            dropped[STEP_OVER_CAP] += 1
        else:
            kept[number - 1] = text
    return kept, dict(dropped)


def is_placeholder(skill: str) -> bool:
    """A template echo ("<the rule>"), an ellipsis, or a filler like "N/A" / "none"."""
    s = skill.strip()
    if re.fullmatch(r"<[^<>]*>[.\s]*", s):
        return True  # the template's "<the rule>" or another angle-bracketed stand-in
    norm = re.sub(r"[\s\"'`*_.:;!,]+", " ", s.lower()).strip()
    if norm in _PLACEHOLDERS or s.strip(" .…") == "":
        return True
    return False


# ---------------------------------------------------------------------------------------------------------------


def _candidates(raw: str) -> list[str]:
    """JSON object texts worth trying: fenced blocks first, then the outermost {...} spans of the whole answer."""
    out: list[str] = []
    for block in _FENCE.findall(raw):
        out.extend(_object_spans(block))
    out.extend(_object_spans(raw))
    seen: set[str] = set()
    return [c for c in out if not (c in seen or seen.add(c))]


def _object_spans(text: str) -> list[str]:
    """Brace-balanced {...} spans (string-aware), plus first '{' to last '}' as a last resort."""
    spans: list[str] = []
    depth = 0
    start = -1
    in_str = False
    esc = False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"' and depth > 0:
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    first, last = text.find("{"), text.rfind("}")
    if 0 <= first < last:
        spans.append(text[first : last + 1])
    return spans


def _loads(text: str) -> object | None:
    for attempt in (text, _TRAILING_COMMA.sub(r"\1", text), _TRAILING_COMMA.sub(r"\1", _straighten(text))):
        try:
            return json.loads(attempt, strict=False)  # strict=False: raw newlines inside strings are fine
        except ValueError:
            continue
    return None


def _straighten(text: str) -> str:
    return text.replace("“", '"').replace("”", '"').replace("‘", "'").replace("’", "'")


def _pick(obj: dict, keys: tuple[str, ...]) -> str | None:
    lowered = {str(k).strip().lower().replace(" ", "_"): v for k, v in obj.items()}
    for key in keys:
        if key in lowered:
            value = lowered[key]
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = " ".join(value)
            return value if isinstance(value, str) else None
    return None


def _pick_table(obj: dict) -> object:
    lowered = {str(k).strip().lower().replace(" ", "_"): v for k, v in obj.items()}
    return next((lowered[key] for key in STEP_KEYS if key in lowered), None)


def _json_objects(raw: str) -> list[dict]:
    """Every candidate that parses as a JSON object holding a summary, a skill or step skills."""
    out = []
    for cand in _candidates(raw):
        obj = _loads(cand)
        if isinstance(obj, dict) and any(
            v is not None for v in (_pick(obj, SUMMARY_KEYS), _pick(obj, SKILL_KEYS), _pick_table(obj))
        ):
            out.append(obj)
    return out


def _regex_step_table(raw: str) -> object:
    """The `step_skills` object of a broken answer (its enclosing JSON did not parse), or None."""
    m = _STEP_TABLE.search(raw)
    if m is None:
        return None
    spans = _object_spans(raw[m.end() :])
    return _loads(spans[0]) if spans else None


def _json_field_pairs(raw: str) -> list[tuple[str | None, str | None]]:
    """(summary, skill) of every candidate that parses as a JSON object holding at least one of the two fields."""
    pairs = [(_pick(obj, SUMMARY_KEYS), _pick(obj, SKILL_KEYS)) for obj in _json_objects(raw)]
    return [pair for pair in pairs if pair != (None, None)]


def _regex_field(raw: str, names: tuple[str, ...]) -> str | None:
    alt = "|".join(re.escape(n).replace("_", "[_ ]") for n in names)
    # "key": "value" inside broken JSON (unbalanced braces, a truncated tail after the value, single quotes)
    m = re.search(rf'["\']?(?:{alt})["\']?\s*:\s*"((?:[^"\\]|\\.)*)"', raw, re.IGNORECASE | re.DOTALL)
    if m:
        try:
            return json.loads(f'"{m.group(1)}"', strict=False)
        except ValueError:
            return m.group(1)
    m = re.search(rf"[\"']?(?:{alt})[\"']?\s*:\s*'((?:[^'\\]|\\.)*)'", raw, re.IGNORECASE | re.DOTALL)
    if m:
        return m.group(1)
    # "Episode skill: ..." / "**episode_skill**: ..." on its own line (prose or YAML-ish answers)
    m = re.search(rf"^[\W_]*(?:{alt})[*_\s\"']*[:=][*_\s]*(.+)$", raw, re.IGNORECASE | re.MULTILINE)
    if m:
        return m.group(1).strip().strip('",').strip()
    return None


def _regex_fields(raw: str) -> tuple[str | None, str | None]:
    return _regex_field(raw, SUMMARY_KEYS[:1]), _regex_field(raw, SKILL_KEYS[:1])


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = " ".join(value.split())
    return value or None
