"""README's cheap commands run as written: `--help`, `seed envs`, `seed env`, `seed runs`, taken from the README itself
(tests/unit/test_docs.py checks that every other command names a command, option, preset and file that exist; the
stage commands run through every stage in tests/integration/test_*_cli.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.helpers_cli import REPO, seed_cli

CHEAP = {"envs", "env", "runs"}


def cheap_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            words = shlex.split(line) if line.startswith("seed ") else []
            if words and (words[-1] == "--help" or words[1] in CHEAP):
                found.append(line)
    return found


def test_the_readme_shows_the_cheap_commands():
    assert {"seed --help", "seed envs"} <= set(cheap_commands())


@pytest.mark.parametrize("line", cheap_commands())
def test_a_cheap_readme_command_runs_as_written(line: str, tmp_path: Path):
    # in an empty working directory, as on a fresh clone before any run (runs/ there is the test's own)
    proc = seed_cli(*shlex.split(line)[1:], cwd=tmp_path, timeout=300)
    assert proc.stdout.strip(), line
    if line == "seed envs":
        for name in ("alfworld", "webshop", "search", "sokoban", "ezpoints"):
            assert re.search(rf"^{name} \(", proc.stdout, re.MULTILINE), name
    if line == "seed --help":
        for command in ("collect", "annotate", "sft", "rl", "eval", "envs", "report"):
            assert command in proc.stdout
