"""`seed inspect RUN`: read a run's episodes as a person would. Works for every stage that plays episodes.

    seed inspect runs/eval/<id>                  # a table of the episodes (id, category, won, score, length), then one in full
    seed inspect runs/eval/<id> --failed         # only the failed episodes
    seed inspect runs/eval/<id> --plays          # the commonest action sequences, won and lost: how a policy fails
    seed inspect runs/collect/<id> --episode e0003-r01
    seed inspect runs/rl/<id> --step 12          # rl: a sampled update, per-token score shift (seedcli.rl.inspect)

An episode in full: its task, then each turn's observation (abridged), response (abridged), action, whether it was
valid and admissible, the invalid-turn penalty rl would give it, any image observation (as a path, for visual
environments), and the episode's reward and score. Collect runs hold trajectories.jsonl, eval runs episodes.jsonl;
both hold `seedcli.records.Trajectory` records.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from seedcli.envs import env_class
from seedcli.errors import UserError
from seedcli.images import IMAGES_DIR
from seedcli.records import RECORD_SCHEMA_VERSION, iter_jsonl
from seedcli.rl.inspect import show_samples

EPISODE_FILES = {"collect": "trajectories.jsonl", "eval": "episodes.jsonl"}
SAMPLES = "samples.jsonl"
OBSERVATION_CHARS = 400  # an observation is shown up to this many characters
RESPONSE_CHARS = 300
TABLE_ROWS = 200  # longer listings end with a count of the rows left out
PLAYS_ROWS = 20  # --plays lists this many of the commonest action sequences
PLAY_CHARS = 90  # a play is shown up to this many characters
IMAGE_KEYS = ("images", "image", "observation_images")  # where a visual environment's record names its images


def locate(run: str | Path) -> tuple[str, Path]:
    """("rl", samples.jsonl) or ("episodes", the collect/eval episode file) of a run directory or file."""
    path = Path(run)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory; pass a run directory (runs/<stage>/<id>/)")
    if path.is_file():
        return ("rl" if path.name == SAMPLES else "episodes"), path
    stage = None
    manifest = path / "manifest.json"
    if manifest.is_file():
        try:
            stage = json.loads(manifest.read_text()).get("stage")
        except (OSError, ValueError, AttributeError):
            stage = None
    if stage == "rl" or (stage is None and (path / SAMPLES).exists()):
        return "rl", path
    for name in [EPISODE_FILES[stage]] if stage in EPISODE_FILES else list(EPISODE_FILES.values()):
        if (path / name).exists():
            return "episodes", path / name
    what = f"a {stage} run" if stage else "not a run directory"
    raise UserError(
        f"{path}: {what} with no {' or '.join(EPISODE_FILES.values())}; `seed inspect` takes a collect or eval run "
        "(its episodes) or an rl run (its sampled updates)"
    )


def read_episodes(path: Path) -> list[dict[str, Any]]:
    """The episode records of a collect/eval file as dicts (extra fields, such as image paths, kept); records of
    schema 1 (ALFWorld: game_file, task_type) are read under schema 2's names."""
    episodes = []
    for lineno, rec in enumerate(iter_jsonl(path), start=1):
        if not isinstance(rec, dict) or "turns" not in rec or "episode_id" not in rec:
            raise UserError(f"{path}:{lineno}: not an episode record (no episode_id/turns); pass a collect or eval run")
        version = rec.get("schema_version", 1)
        if isinstance(version, int) and version > RECORD_SCHEMA_VERSION:
            raise UserError(
                f"{path}:{lineno}: record schema {version} is newer than this seedcli's ({RECORD_SCHEMA_VERSION}); "
                "upgrade seedcli to read it"
            )
        rec.setdefault("category", rec.get("task_type", ""))
        rec.setdefault("task_id", rec.get("game_file", ""))
        rec.setdefault("env", "alfworld")
        rec.setdefault("score", 1.0 if rec.get("won") else 0.0)
        episodes.append(rec)
    if not episodes:
        raise UserError(f"{path}: no episodes yet; inspect again once the run has finished some")
    return episodes


def pick_episode(episodes: list[dict], episode_id: str, path: Path) -> dict:
    """The episode with this id (or, failing that, this task id); else a one-line error naming a few that exist."""
    for key in ("episode_id", "task_id"):
        for rec in episodes:
            if rec.get(key) == episode_id:
                return rec
    ids = [str(r["episode_id"]) for r in episodes]
    shown = ", ".join(ids[:5]) + (f", … ({len(ids)} in all)" if len(ids) > 5 else "")
    raise UserError(f"no episode {episode_id!r} in {path}; its episodes are {shown}")


def abridge(text: str, limit: int) -> str:
    """The text up to `limit` characters, with what was cut counted ("… (+123 chars)")."""
    text = str(text)
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + f" … (+{len(text) - limit} chars)"


def _images(record: dict, base: Path) -> list[str]:
    """Image paths a record names (a visual environment's observations), resolved against the run directory."""
    out = []
    for key in IMAGE_KEYS:
        value = record.get(key)
        for item in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
            if not isinstance(item, str):
                continue
            if re.fullmatch(r"[0-9a-f]{64}", item):  # a turn's image: its sha256, stored as images/<sha256>.png
                item = f"{IMAGES_DIR}/{item}.png"
            path = Path(item) if Path(item).is_absolute() else base / item
            out.append(f"{path}" + ("" if path.exists() else " (missing)"))
    return out


def _penalty(env_name: str) -> float | None:
    try:
        return float(env_class(env_name).invalid_penalty)
    except UserError:
        return None


def _score_text(score: Any) -> str:
    return f"{score:.2f}" if isinstance(score, (int, float)) and not isinstance(score, bool) else "—"


def episode_table(episodes: list[dict], title: str):
    """A rich Table of the episodes: id, category, won, score, length, invalid turns, task (abridged)."""

    table = Table(title=title)
    for col in ("episode", "category", "won", "score", "length", "invalid"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("score", "length", "invalid") else "left")
    table.add_column("task", no_wrap=True, overflow="ellipsis", max_width=72)
    for rec in episodes[:TABLE_ROWS]:
        invalid = sum(not t.get("valid", True) for t in rec.get("turns", []))
        table.add_row(
            str(rec["episode_id"]),
            str(rec.get("category", "")),
            "[green]yes[/green]" if rec.get("won") else "[red]no[/red]",
            _score_text(rec.get("score")),
            str(rec.get("length", len(rec.get("turns", [])))),
            str(invalid),
            str(rec.get("task", "")),
        )
    return table


def render_episode(rec: dict[str, Any], base: Path) -> list:
    """Rich renderables for one episode in full."""

    penalty = _penalty(rec.get("env", "alfworld"))
    won = bool(rec.get("won"))
    head = Text()
    head.append(f"episode {rec['episode_id']}  ", style="bold")
    head.append(f"{rec.get('env', '')} {rec.get('split', '')} · {rec.get('category', '')}  ")
    head.append("WON" if won else "lost", style="bold green" if won else "bold red")
    head.append(f"  score {_score_text(rec.get('score'))}  reward {rec.get('reward', 0.0):g}")
    head.append(f"  ({rec.get('length', len(rec.get('turns', [])))} steps)\n")
    head.append(f"task id: {rec.get('task_id', '')}\n")
    policy = rec.get("policy", "model")
    head.append(f"policy: {policy}" + (f" ({rec.get('model_id', '')})" if policy == "model" else "") + "\n")
    head.append("task: ", style="bold")
    head.append(str(rec.get("task", "")))
    for image in _images(rec, base):
        head.append(f"\nimage: {image}")
    out: list = [Panel(head, title="seed inspect", expand=True)]
    for turn in rec.get("turns", []):
        line = Text()
        line.append(f"turn {turn.get('step')}: ", style="bold")
        line.append(f"action '{turn.get('action', '')}'  ")
        valid = turn.get("valid", True)
        line.append("valid" if valid else "INVALID", style="green" if valid else "red")
        if not valid and penalty:
            line.append(f" (rl penalty −{penalty:g})")
        shown = turn.get("admissible") or []
        # a placeholder such as WebShop's "search[<your query>]" stands for free text: nothing to flag there
        if shown and not turn.get("admissible_action", False) and not any("<" in a for a in shown):
            line.append("  not an admissible action", style="yellow")
        if turn.get("finish_reason") == "length":
            line.append("  cut at max_new_tokens", style="yellow")
        out.append(line)
        body = Text()
        body.append("  observation: ", style="dim")
        observation = turn.get("observation", "").replace("\t", "")  # grids (Sokoban) separate cells by tabs
        body.append(abridge(observation, OBSERVATION_CHARS).replace("\n", " ⏎ "))
        for image in _images(turn, base):
            body.append(f"\n  image: {image}", style="dim")
        body.append("\n  response: ", style="dim")
        body.append(abridge(turn.get("response", ""), RESPONSE_CHARS).replace("\n", " ⏎ "))
        out.append(body)
    tail = Text()
    tail.append("outcome: ", style="bold")
    tail.append("won" if won else "not won")
    tail.append(
        f"; score {_score_text(rec.get('score'))} (the environment's, in [0, 1]); reward {rec.get('reward', 0.0):g}"
    )
    invalid = sum(not t.get("valid", True) for t in rec.get("turns", []))
    if invalid and penalty:
        tail.append(f"; {invalid} invalid turn(s), −{penalty:g} each in rl")
    out.append(tail)
    return out


def play_of(rec: dict[str, Any]) -> str:
    """An episode's actions in order, as one line: joined by spaces ("2 + 10 ="), or by " | " when an action holds a
    space ("go to desk 1 | open drawer 2")."""
    actions = [str(t.get("action", "")) for t in rec.get("turns", [])]
    return (" | " if any(" " in a for a in actions) else " ").join(actions)


def plays_table(episodes: list[dict], title: str, rows: int = PLAYS_ROWS):
    """A rich Table of the commonest plays (`play_of`), each with the episodes that played it, won and lost."""
    counts: dict[str, list[int]] = {}
    for rec in episodes:
        tally = counts.setdefault(play_of(rec), [0, 0])
        tally[0 if rec.get("won") else 1] += 1
    table = Table(title=title)
    for col in ("episodes", "won", "lost"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("actions", no_wrap=True, overflow="ellipsis", max_width=PLAY_CHARS + 20)
    ranked = sorted(counts.items(), key=lambda kv: (-sum(kv[1]), -kv[1][0], kv[0]))
    for play, (won, lost) in ranked[:rows]:
        table.add_row(str(won + lost), str(won), str(lost), abridge(play, PLAY_CHARS) or "(no turn)")
    return table, len(counts)


def show_episodes(
    run: str | Path, *, episode: str | None = None, failed: bool = False, plays: bool = False, console=None
) -> dict[str, Any] | None:
    """Print a collect/eval run's episodes: with `episode`, that one in full; else a table (only the failed ones
    with `failed`) and the first listed in full. Returns the episode shown in full (None when none is listed)."""

    kind, path = locate(run)
    if kind != "episodes":
        raise UserError(f"{run}: an rl run; its logged samples are chosen with --step N, not --episode/--failed")
    base = path.parent
    episodes = read_episodes(path)
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)  # a pipe or a file: no need to squeeze into 80 columns
    if episode is not None:
        rec = pick_episode(episodes, episode, path)
        for item in render_episode(rec, base):
            console.print(item)
        return rec
    episodes = sorted(episodes, key=lambda r: str(r["episode_id"]))  # the file holds them in the order they ended
    listed = [r for r in episodes if not r.get("won")] if failed else episodes
    wins = sum(bool(r.get("won")) for r in episodes)
    scores = [r["score"] for r in episodes if isinstance(r.get("score"), (int, float))]
    summary = f"{len(episodes)} episodes, {wins} won" + (
        f", mean score {sum(scores) / len(scores):.3f}" if scores else ""
    )
    if not listed:
        console.print(f"{path}: {summary}; no failed episode to show")
        return None
    if plays:
        table, distinct = plays_table(listed, "commonest plays" + (" of the failed episodes" if failed else ""))
        console.print(table)
        shown = min(distinct, PLAYS_ROWS)
        console.print(
            f"{path}: {summary}; {distinct} distinct action sequences among {len(listed)} listed, {shown} shown"
        )
        return None
    console.print(episode_table(listed, f"{'failed episodes' if failed else 'episodes'} of {path}"))
    if len(listed) > TABLE_ROWS:
        console.print(f"… {len(listed) - TABLE_ROWS} more not listed (`--episode ID` shows any of them)")
    console.print(f"{summary}. Shown in full: {listed[0]['episode_id']} (`--episode ID` for another)\n")
    for item in render_episode(listed[0], base):
        console.print(item)
    return listed[0]


def inspect_run(
    run: str | Path,
    *,
    step: int | None = None,
    episode: str | None = None,
    failed: bool = False,
    plays: bool = False,
    console=None,
) -> dict[str, Any] | None:
    """`seed inspect RUN`: an rl run's sampled update (`step`), or a collect/eval run's episodes (`plays`: their
    commonest action sequences)."""
    kind, path = locate(run)
    if kind == "rl":
        if episode is not None or failed or plays:
            raise UserError(
                f"{run}: an rl run; --episode, --failed and --plays read the episodes of collect and eval runs, an "
                "rl run's logged samples are chosen with --step N"
            )

        return show_samples(path, step, console)
    if step is not None:
        raise UserError(
            f"{run}: not an rl run; --step chooses an rl run's update, here choose an episode with --episode ID"
        )
    if plays and episode is not None:
        raise UserError(f"{run}: --plays lists the commonest action sequences of all episodes; drop --episode")
    return show_episodes(path, episode=episode, failed=failed, plays=plays, console=console)
