"""Reading WebShop's replies as verl-agent's `webshop_projection` reads them, quirks kept."""

from __future__ import annotations

import re

_CJK_RE = re.compile(r"[\u4e00-\u9fff]")


def project_action(response: str) -> tuple[str, bool]:
    """verl-agent's webshop_projection: (action, valid). The reply is lower-cased; the action is the text between
    <action> and </action>; without those tags, the last 20 characters are sent and the turn is invalid; missing
    <think> tags or a CJK character also make it invalid."""
    lowered = response.lower()
    start, end = lowered.find("<action>"), lowered.find("</action>")
    if start == -1 or end == -1:
        return lowered[-20:], False
    action = lowered[start + len("<action>") : end].strip().lower()
    valid = response.find("<think>") != -1 and response.find("</think>") != -1
    if _CJK_RE.search(response):
        valid = False
    return action, valid
