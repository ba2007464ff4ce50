"""The front door: README.md stays short and every command in it names a target, file, command, option and preset
that exists; the CLI reference lists every `seed` command and option; CHANGELOG.md is a list of dated releases whose
newest matches pyproject.toml; user-facing text carries no work history. Read from the files, nothing is run here
(tests/integration/test_readme_commands.py runs the cheap commands)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# pages whose text other tools write (the method checks' reports) or that record the authors' code as it is (parity);
# every other page of docs/ is held to the no-work-history rule
GENERATED_OR_RECORDED = {"parity.md", "method-check.md", "method-check-tiny.md", "method-check-avx2.md"}


@cache
def cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def seed_commands() -> dict[str, set[str]]:
    """'seed rl' -> the option names it takes (every alias, --x and --no-x)."""
    out = {}
    for path, cmd, _ctx in cli_reference().commands():
        names = set()
        for param in cmd.params:
            names.update(getattr(param, "opts", []) or [])
            names.update(getattr(param, "secondary_opts", []) or [])
        out[" ".join(path)] = names | {"--help"}
    return out


def readme_commands() -> list[str]:
    """Every command line of README's bash blocks, and every inline `seed ...` span, comments and prompts removed."""
    text = README.read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(line)
    spans = re.findall(r"`(seed [^`]+)`", text)
    lines += [m for m in spans if not re.search(r"<|…|\b[A-Z]{2,}\b", m)]  # not a pattern such as `seed COMMAND`
    return lines


def check_seed_command(words: list[str]) -> list[str]:
    """What is wrong with one `seed ...` command line: an unknown command or option, a preset that does not exist."""
    commands = seed_commands()
    path = ["seed"]
    rest = words[1:]
    while rest and " ".join([*path, rest[0]]) in commands:
        path.append(rest.pop(0))
    name = " ".join(path)
    problems = []
    if name == "seed" and rest and not rest[0].startswith("-"):
        problems.append(f"unknown command {rest[0]!r}")
    for i, word in enumerate(rest):
        option = word.split("=", 1)[0]
        if re.fullmatch(r"--?[A-Za-z][\w-]*", option) and option not in commands[name]:
            problems.append(f"{name}: unknown option {option}")
        if option in ("-c", "--config") and i + 1 < len(rest):
            preset = rest[i + 1]
            if not (ROOT / "configs" / f"{preset}.yaml").is_file() and not (ROOT / preset).is_file():
                problems.append(f"{name}: no preset {preset!r} under configs/")
    return problems


def test_readme_is_short_and_has_the_front_door_sections():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 160
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    for wanted in ("Install", "stages", "Results", "GPUs", "Bring your own", "Documentation", "Cit", "Licence"):
        assert any(wanted in h for h in headings), (wanted, headings)
    assert "make demo" in text and "make test" in text
    assert re.search(r"!\[[^]]+\]\(docs/assets/[^)]+\)", text), "one picture"
    assert "not yet run" in text, "GPU rows of the results table say they have not been run"


def test_every_readme_command_names_what_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.MULTILINE))
    problems = []
    commands = readme_commands()
    assert len(commands) > 15  # the reader found the blocks
    for line in commands:
        words = shlex.split(line)
        while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value prefixes
            words.pop(0)
        if not words:
            continue
        if words[0] == "make":
            problems += [f"make: no target {t}" for t in words[1:] if t not in targets]
        elif words[0] in ("python", "bash"):
            if not (ROOT / words[1]).is_file():
                problems.append(f"{line}: no file {words[1]}")
        elif words[0] == "seed":
            problems += [f"{line}: {p}" for p in check_seed_command(words)]
        elif words[0] != "source":
            problems.append(f"{line}: a command the test does not know how to check")
    assert not problems, problems


def test_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            missing.append(target)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(encoding="utf-8"), re.MULTILINE)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            if anchor not in slugs:
                missing.append(target)
    assert not missing, missing


def test_the_cli_reference_lists_every_command_and_option():
    page = cli_reference().render()
    commands = seed_commands()
    assert {"seed collect", "seed annotate", "seed sft", "seed rl", "seed eval", "seed warmstart", "seed probe"} <= set(
        commands
    )
    assert {"seed runs", "seed env", "seed envs", "seed report", "seed plot", "seed inspect", "seed model init"} <= set(
        commands
    )
    for path, cmd, ctx in cli_reference().commands():
        name = " ".join(path)
        assert re.search(rf"^#+ `{re.escape(name)}`$", page, re.MULTILINE), name
        section = page.split(f"`{name}`\n", 1)[1]
        for param in cmd.params:
            if getattr(param, "hidden", False) or not getattr(param, "opts", None):
                continue
            record = param.get_help_record(ctx)
            assert record and f"| `{record[0]}` |" in section, (name, param.opts)
    assert "(default: 0.01)" in page  # defaults come along (kl_coef, opd_coef)


@cache
def changelog() -> str:
    return (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_changelog_is_dated_releases_whose_newest_is_the_package_version():
    text = changelog()
    versions = re.findall(r"^## \[(.+?)\](.*)$", text, re.MULTILINE)
    assert versions[0] == ("Unreleased", "")
    released = versions[1:]
    assert released, "at least one release"
    for version, rest in released:
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
        assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", rest), (version, rest)
    numbers = [tuple(int(x) for x in v.split(".")) for v, _ in released]
    dates = [rest[3:] for _, rest in released]
    assert numbers == sorted(numbers, reverse=True) and dates == sorted(dates, reverse=True)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["version"] == released[0][0]


def test_changelog_entries_are_one_line_each_under_keep_a_changelog_headings():
    kinds = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    body = changelog().split("## [Unreleased]", 1)[1]
    for line in body.splitlines():
        if line.startswith("### "):
            assert line[4:] in kinds, line
        else:
            assert not line or line.startswith(("## [", "- ")), f"a bullet runs over one line: {line!r}"


def user_facing_texts() -> dict[str, str]:
    texts = {"README.md": README.read_text(encoding="utf-8"), "CHANGELOG.md": changelog()}
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name not in GENERATED_OR_RECORDED:
            texts[f"docs/{page.name}"] = page.read_text(encoding="utf-8")
    texts["docs/reference/cli.md (seed --help)"] = cli_reference().render()
    return texts


@pytest.mark.parametrize("name", sorted(user_facing_texts()))
def test_user_facing_text_carries_no_work_history(name):
    text = user_facing_texts()[name]
    # an issue of *another* repository ("the SEED repository's issue #2") is a citation, not our history
    found = re.findall(r"(?i)\b(?:issues? \d+|sittings?\b)", text)
    assert not found, (name, found)
