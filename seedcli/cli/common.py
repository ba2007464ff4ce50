"""What every `seed` command shares: the one-line error (exit 2) and the crash log of an unexpected error (exit 1)."""

from __future__ import annotations

import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console

err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """One line on stderr, exit code 2 (the user can fix this) or the error's own code."""
    message = " ".join(str(message).split())  # one line, whatever the message held
    err_console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def crash_log(exc: BaseException, stage: str, runs_dir: str | None) -> Path:
    """Write the traceback of an unexpected error to a log file (in the run directory when one is left, else
    <runs_dir>/logs/) and return its path."""
    from seedcli.artifacts import CURRENT_RUN

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if CURRENT_RUN is not None and CURRENT_RUN.is_dir():
        path = CURRENT_RUN / f"error-{stamp}.log"
    else:
        path = Path(runs_dir or "runs") / "logs" / f"{stamp}-{stage}.log"
    text = f"seed {' '.join(sys.argv[1:])}\n\n" + "".join(traceback.format_exception(exc))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError:
        import tempfile

        fd, name = tempfile.mkstemp(prefix=f"seed-{stage}-", suffix=".log")
        with open(fd, "w") as fh:
            fh.write(text)
        path = Path(name)
    return path


def unexpected(exc: BaseException, stage: str, runs_dir: str | None) -> typer.Exit:
    """An error nobody anticipated: one line with where the traceback is, exit code 1."""
    log = crash_log(exc, stage, runs_dir)
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return fail(
        f"unexpected {type(exc).__name__}: {first} — traceback in {log}; please report it with that file and `seed env`",
        1,
    )
