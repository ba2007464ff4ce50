"""Reading EZPoints' replies as verl-agent's `gym_projection` reads them for 'gym_cards/EZPoints-v0', quirks kept:
everything from the first `"action":` on is searched for the 13 action names, "10" first; exactly one name found is a
valid reply, anything else is invalid and plays no action; with no `"action":` at all only the reply's last character
is searched. A reply is a JSON object with `thoughts` and `action` (`format_response`).
"""

from __future__ import annotations

import json

from seedcli.envs.ezpoints.game import ACTION_NAMES


def gym_projection(response: str) -> tuple[str, bool]:
    """verl-agent `gym_projection` for 'gym_cards/EZPoints-v0' on one reply: (action name, valid); the name is ""
    (no action: index -1) unless exactly one of the 13 names is found."""
    text = response.lower()
    text = text[text.find('"action":') :]  # quirk kept: no '"action":' leaves only the last character
    found = []
    if "10" in text:  # 'points' is in the env name: "10" is taken first so that it does not also count as "1"
        found.append("10")
        text = text.replace("10", "")
    found.extend(name for name in ACTION_NAMES if name in text)
    found = list(set(found))
    if len(found) == 1:
        return found[0], True
    return "", False


def format_response(think: str, action: str) -> str:
    """A well-formed reply that `gym_projection` reads back as `action`: the JSON the template asks for."""
    return json.dumps({"thoughts": think, "action": action}, indent=2)
