"""What every `seed` command shares: the one-line error (exit 2), the crash log of an unexpected error (exit 1),
and `cli_errors`, the one place a command's errors become those."""

from __future__ import annotations

import contextlib
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console

from seedcli.errors import UserError

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


@contextlib.contextmanager
def cli_errors(
    command: str,
    runs_dir: Callable[[], str | None] = lambda: None,
    on_interrupt: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Every command's body runs in this: a `UserError` is its one line and exit code (2 unless it says), Ctrl-C is
    exit 130 (after `on_interrupt`, e.g. the `--resume` hint), anything else is `unexpected` (exit 1, the traceback
    in a log under `runs_dir()`, read only then: the config may not have been built)."""
    try:
        yield
    except UserError as exc:
        raise fail(str(exc), exc.exit_code) from None
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt()
        raise typer.Exit(130) from None
    except (typer.Exit, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - the catch-all: one line here, the traceback in a file
        raise unexpected(exc, command, runs_dir()) from None
