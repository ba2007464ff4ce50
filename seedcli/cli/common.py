"""What every `seed` command shares: the one-line error (exit 2), the crash log of an unexpected error (exit 1),
and `cli_errors`, the one place a command's errors become those."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from seedcli.errors import EnvFault, UserError

err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """One line on stderr, exit code 2 (the user can fix this) or the error's own code."""
    message = escape(" ".join(str(message).split()))  # one line; `.[textarena]` is text, not a rich markup tag
    err_console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def crash_log(exc: BaseException, stage: str, runs_dir: str | None, detail: str = "") -> Path:
    """Write the traceback of an unexpected error (or `detail`, one an environment's worker sent) to a log file (in
    the run directory when one is left, else <runs_dir>/logs/) and return its path."""
    from seedcli.artifacts import CURRENT_RUN

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if CURRENT_RUN is not None and CURRENT_RUN.is_dir():
        path = CURRENT_RUN / f"error-{stamp}.log"
    else:
        path = Path(runs_dir or "runs") / "logs" / f"{stamp}-{stage}.log"
    text = f"seed {' '.join(sys.argv[1:])}\n\n" + (detail or "".join(traceback.format_exception(exc)))
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
    except EnvFault as exc:  # the environment's own fault: its one line, the traceback in the run's log
        log = crash_log(exc, command, runs_dir(), exc.detail) if exc.detail else None
        raise fail(f"{exc} (traceback in {log})" if log else str(exc), exc.exit_code) from None
    except UserError as exc:
        raise fail(str(exc), exc.exit_code) from None
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt()
        raise typer.Exit(130) from None
    except (typer.Exit, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - the catch-all: one line here, the traceback in a file
        full = disk_full(exc)
        if full is not None:
            raise fail(no_space_message(full, command)) from None
        denied = not_writable(exc)
        if denied is not None:
            raise fail(not_writable_message(denied, command)) from None
        raise unexpected(exc, command, runs_dir()) from None


def out_dir(out: Path, what: str) -> Path:
    """An `--out` directory a command writes into (made when missing): a file there is a one-line error."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: a file, not a directory; pass a directory for the {what} (made if missing)")
    return out


def disk_full(exc: BaseException) -> OSError | None:
    """The "no space left" (ENOSPC, or a full quota) behind `exc`: itself, its cause or its context, or an error
    whose message says so (torch's and safetensors' writers wrap the OSError); None when the disk is not the cause."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return exc
        if "No space left on device" in str(exc):
            return OSError(errno.ENOSPC, "No space left on device")
        exc = exc.__cause__ or exc.__context__
    return None


def no_space_message(exc: OSError, command: str) -> str:
    """ "no space left on DEVICE (N MB free); free space and run --resume" for the file the write failed on (else
    the run being written, else the working directory); what was written is kept for the resume."""
    from seedcli.artifacts import CURRENT_RUN

    where = Path(exc.filename) if exc.filename else (CURRENT_RUN if CURRENT_RUN is not None else Path.cwd())
    where = where.absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    mount = mount_of(where)
    try:
        free = f"{shutil.disk_usage(where).free / 1e6:.0f} MB free"
    except OSError:
        free = "free space unknown"
    if CURRENT_RUN is not None and CURRENT_RUN.is_dir():
        again = f"run `seed {command} --resume {CURRENT_RUN}` (what was written is kept)"
    elif command == "model":
        again = "run the command again (nothing was kept)"
    else:  # no run directory was left: nothing to resume
        again = f"run `seed {command}` again"
    return f"no space left on {mount} ({free}); free space and {again}"


def mount_of(path: Path) -> Path:
    """The mount point holding `path`: the longest mount point of /proc/self/mountinfo above it (a bind mount on the
    same device as its parent counts, which `os.path.ismount` misses), else the nearest `ismount` ancestor."""
    path = Path(path).absolute()
    try:
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            field = line.split(" ")[4]  # the mount point, with spaces and the like as octal escapes
            points.append(Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)))
        above = [p for p in points if p == path or p in path.parents]
        if above:
            return max(above, key=lambda p: len(p.parts))
    except (OSError, IndexError):
        pass
    mount = path
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return mount


def not_writable(exc: BaseException) -> OSError | None:
    """The "read-only file system" (EROFS) or "permission denied" (EACCES, EPERM, on a file it names) behind `exc`:
    itself, its cause or its context; None when neither is the cause."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and (
            exc.errno == errno.EROFS or (exc.errno in (errno.EACCES, errno.EPERM) and exc.filename)
        ):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def not_writable_message(exc: OSError, command: str) -> str:
    """ "cannot write FILE: the file system at MOUNT is read-only (or: permission denied); ..." with where to write
    instead: --runs-dir for a stage, --out for the commands that take one."""
    where = Path(exc.filename or Path.cwd()).absolute()
    if exc.errno == errno.EROFS:
        mount = mount_of(where)
        why = f"the file system at {mount} is read-only"
    else:
        why = "permission denied"
    from seedcli.artifacts import CURRENT_RUN

    if CURRENT_RUN is not None and CURRENT_RUN.is_dir():  # it turned read-only mid-run: what was written is kept
        return f"cannot write {where}: {why}; once it is writable, run `seed {command} --resume {CURRENT_RUN}`"
    flag = "--out DIR" if command in ("report", "plot", "model") else "--runs-dir DIR"
    return f"cannot write {where}: {why}; pass {flag} on a disk you can write to (nothing was written)"


class OneLineErrors(TyperGroup):
    """The `seed` command group: click's usage errors (an unknown option, a value out of range or of the wrong type,
    a missing argument) are the one `error:` line of every other error (`fail`), exit code 2, not a usage box."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: ANN001
        import seedcli.artifacts

        # a command's messages name the run *it* opened: one called in the same process before (a notebook, a test
        # runner) must not lend it its run directory for a log or a `--resume` hint
        seedcli.artifacts.CURRENT_RUN = None
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:  # Ctrl-C or end of input outside a command's own handler
            err_console.print("interrupted")
            sys.exit(130)
        except Exception as exc:
            # click's exceptions (Typer ships its own copy of click): known by what they carry, not by class
            if not (hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)):
                raise
            if type(exc).__name__ == "NoArgsIsHelpError":  # `seed` or `seed model` alone: the help is printed
                sys.exit(exc.exit_code)
            ctx = getattr(exc, "ctx", None)
            where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            fail(f"{exc.format_message().rstrip('.')}{where}", exc.exit_code)
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)
