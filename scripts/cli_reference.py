"""The CLI reference, rendered from the `seed` Typer app itself so that it cannot drift from the code.

    python scripts/cli_reference.py            # print the Markdown page
    python scripts/cli_reference.py --out F    # write it to F

MkDocs loads this file as a hook (`hooks:` in mkdocs.yml): `on_files` adds the page `reference/cli.md` to the site at
build time, so the repository holds no generated copy. Every command and subcommand of `seed` gets a section with its
help, its usage line and a table of its options (each option's names, type, help, default and range, as
`seed COMMAND --help` prints them).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PAGE = "reference/cli.md"

INTRO = """# CLI reference

Every `seed` command with its options, generated from the command-line app when the documentation is built (the
same text `seed COMMAND --help` prints). The stage commands (`collect`, `annotate`, `sft`, `rl`, `eval`,
`warmstart`, `probe`) take their options from the stage's config: any option can also be given as a trailing
`key=value` override or in a config file (`--config`), and `--print-config` shows the resolved config.
"""


def commands() -> Iterator[tuple[list[str], Any, Any]]:
    """(path, command, context) for `seed` and every command below it, depth first in the app's order."""
    import typer

    from seedcli.cli import app

    root = typer.main.get_command(app)

    def walk(cmd: Any, path: list[str], parent: Any) -> Iterator[tuple[list[str], Any, Any]]:
        ctx = cmd.context_class(cmd, info_name=path[-1], parent=parent)
        yield path, cmd, ctx
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            if not sub.hidden:
                yield from walk(sub, [*path, name], ctx)

    yield from walk(root, ["seed"], None)


def _text(s: str) -> str:
    """Markdown-safe text for a table cell or a paragraph: `|` escaped, `<`/`>` escaped outside code spans."""
    parts = (s or "").replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def _help(cmd: Any) -> str:
    text = (cmd.help or "").strip()
    return re.sub(r"\s*\n\s*", " ", text)


def options(cmd: Any, ctx: Any) -> list[tuple[str, str]]:
    """(names and metavar, help with default and range) of every visible option and argument of `cmd`."""
    rows = []
    for param in cmd.params:
        if getattr(param, "hidden", False):
            continue
        record = param.get_help_record(ctx)
        if record is None:  # an argument: its name and nargs
            name = (param.human_readable_name or param.name or "").strip()
            many = "..." if getattr(param, "nargs", 1) == -1 else ""
            record = (f"{name}{many}", getattr(param, "help", None) or "")
        rows.append((record[0], record[1]))
    rows.append(("--help", "Show this message and exit."))
    return rows


def render() -> str:
    out = [INTRO]
    for path, cmd, ctx in commands():
        name = " ".join(path)
        heading = "#" * min(len(path) + 1, 4)
        out.append(f"{heading} `{name}`\n")
        if _help(cmd):
            out.append(_text(_help(cmd)) + "\n")
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        out.append(f"```text\n{name} {usage}\n```\n")
        subs = {n: s for n, s in (getattr(cmd, "commands", None) or {}).items() if not s.hidden}
        if subs:
            out.append("| command | what it does |\n|---|---|")
            for sub_name, sub in subs.items():
                out.append(f"| `{name} {sub_name}` | {_text(_help(sub).split('. ')[0])} |")
            out.append("")
        rows = options(cmd, ctx)
        out.append("| option | meaning |\n|---|---|")
        out.extend(f"| `{o}` | {_text(h)} |" for o, h in rows)
        out.append("")
    return "\n".join(out)


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated reference page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the page here instead of printing it")
    args = parser.parse_args()
    text = render()
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
