"""Does an EZPoints policy already know the formula the oracle skill would hand it? Reads a collect, eval or probe
play file (episodes JSONL) and prints, for all, won and lost episodes, how often the first reply's text states the
winning formula of its cards ("3 + 9 = 12", either order), and the commonest action strings of the lost episodes.

    python scripts/ezpoints_formula_known.py runs/probe/<id>/play_none.jsonl
"""

from __future__ import annotations

import re
import sys
from collections import Counter

import orjson

from seedcli.envs.ezpoints.expert import card_pair


def states_formula(task: str, text: str) -> bool:
    """Whether `text` writes the winning formula of the cards in `task` (`a op b = 12`, either order of the cards)."""
    pair = card_pair(task)  # the values and operator the expert (and the oracle skill) computes
    if pair is None:
        return False
    a, b, op = pair
    op = re.escape(op)
    return bool(re.search(rf"\b{a}\s*{op}\s*{b}\s*=\s*12|\b{b}\s*{op}\s*{a}\s*=\s*12", text))


def main(path: str) -> None:
    episodes = [orjson.loads(line) for line in open(path, "rb") if line.strip()]
    rows = {"all": episodes, "won": [e for e in episodes if e["won"]], "lost": [e for e in episodes if not e["won"]]}
    for name, eps in rows.items():
        known = sum(states_formula(e["task"], e["turns"][0]["response"]) for e in eps if e["turns"])
        print(f"{name}: the first reply states the winning formula in {known} of {len(eps)} episodes")
    plays = Counter("".join(t["action"] for t in e["turns"]) for e in rows["lost"])
    print("lost episodes' commonest action strings:", ", ".join(f"{a!r} ×{n}" for a, n in plays.most_common(8)))


if __name__ == "__main__":
    main(sys.argv[1])
