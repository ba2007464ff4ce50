"""The method check's record without its weights: save it into the repository, restore it in a later sitting.

A full method check (scripts/method_check.sh) takes more than one sitting on two cores, and a sitting on a fresh
machine starts without the last one's runs/. `save` copies every file of $RUNS except model weights and checkpoints
(index.json, commands.jsonl, machine.json, each run's manifest, metrics, results and episodes) into a record
directory that is small enough to commit, with the sha256 of every weight file it left out and its index.json
pointing at the record, so that scripts/method_check_report.py can write the document from the record alone.
`restore` puts the record back under $RUNS (paths rewritten back) and forgets the steps whose weights the next steps
need and the record cannot hold: the warm start and the Stage-1 sft (method_check.sh rebuilds them with the same
commands and seeds, and `verify` then compares their weights with the recorded sha256), and an rl run whose eval
had not run (its checkpoint is gone, so the run is redone). The steps the warm start played (Stage 1's collects and
annotation, its kept fraction and eval: ~30 minutes on two cores) are kept, and `verify-warm`, right after the warm
start's rebuild, keeps them only if the rebuilt warm start has the recorded sha256 (else they are redone with it).
  python scripts/method_check_archive.py save --runs runs/method-check --to docs/method-check/record
  python scripts/method_check_archive.py restore --from docs/method-check/record --runs runs/method-check
  python scripts/method_check_archive.py verify-warm --runs runs/method-check  # the rebuilt warm start: same weights?
  python scripts/method_check_archive.py verify --runs runs/method-check   # after the rebuild: same weights?
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npy")
MAX_FILE_BYTES = 8 * 1024 * 1024  # a record file larger than this is a bug in what the record keeps
# the steps whose weights later steps read: rebuilt when a record is restored without them
REBUILT_STEPS = ("warmstart", "sft_stage1")
# the steps whose output the warm start's weights decided: kept on restore while the rebuilt warm start is the same
PLAYED_BY_WARM = ("collect_stage1", "collect_heldout", "annotate_stage1", "kept_before_sft", "eval_warm")
WARM = "models/agent/model.safetensors"
WEIGHTS_FILE = "weights.json"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _left_out(rel: Path) -> bool:
    """Weights and checkpoints stay out of the record (checkpoints/ holds weights and optimiser states)."""
    # an interrupted run's writer.lock names a process of this machine: a later sitting's --resume takes the run over
    return "checkpoints" in rel.parts or rel.suffix in WEIGHT_SUFFIXES or rel.name in (".lock", "writer.lock")


def _rebase(index: dict, old: str, new: str) -> dict:
    """index.json's run paths start with the runs directory they were made under: point them at `new`."""
    old, new = old.rstrip("/"), new.rstrip("/")
    out = {}
    for step, run in index.items():
        if isinstance(run, str) and (run == old or run.startswith(old + "/")):
            run = new + run[len(old) :]
        out[step] = run
    return out


def _model_weights(runs: Path, index: dict) -> dict[str, Path]:
    """The weight files of the models the rl steps start from: the warm start and the Stage-1 sft model."""
    found = {}
    for rel, base in (("models/agent", runs / "models" / "agent"),):
        for f in sorted(base.glob("*.safetensors")):
            found[f"{rel}/{f.name}"] = f
    sft = index.get("sft_stage1")
    if sft:
        for f in sorted((Path(sft) / "model").glob("*.safetensors")):
            found[f"sft_stage1/model/{f.name}"] = f
    return found


def save(runs: Path, to: Path) -> int:
    index = json.loads((runs / "index.json").read_text())
    weights = {name: sha256(path) for name, path in _model_weights(runs, index).items()}
    if to.exists():
        shutil.rmtree(to)
    kept = skipped = 0
    too_big = []
    for src in sorted(p for p in runs.rglob("*") if p.is_file()):
        rel = src.relative_to(runs)
        if _left_out(rel):
            skipped += 1
            continue
        if src.stat().st_size > MAX_FILE_BYTES:
            too_big.append(f"{rel} ({src.stat().st_size // 1024} KiB)")
            continue
        dst = to / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        kept += 1
    (to / "index.json").write_text(json.dumps(_rebase(index, str(runs), str(to)), indent=1))
    (to / WEIGHTS_FILE).write_text(json.dumps({"runs": str(runs), "sha256": weights}, indent=1))
    size = sum(p.stat().st_size for p in to.rglob("*") if p.is_file())
    print(f"record: {kept} files ({size / 1e6:.1f} MB) in {to}; {skipped} weight/checkpoint files left out")
    if too_big:
        print(f"error: left out, over {MAX_FILE_BYTES // 2**20} MiB: {', '.join(too_big)}", file=sys.stderr)
        return 2
    return 0


def restore(record: Path, runs: Path) -> int:
    if (runs / "index.json").exists():
        print(f"error: {runs}/index.json exists: restore only into a fresh runs directory", file=sys.stderr)
        return 2
    if not (record / "index.json").exists():
        print(f"error: {record}/index.json not found: save a record first", file=sys.stderr)
        return 2
    # models/ (the warm start's provenance and warmstart.json) is left for the rebuild to write again
    shutil.copytree(record, runs, dirs_exist_ok=True, ignore=lambda d, names: ["models"] if Path(d) == record else [])
    index = _rebase(json.loads((record / "index.json").read_text()), str(record), str(runs))
    dropped = [s for s in REBUILT_STEPS if s in index]
    for step in list(index):
        if step.startswith("rl_") and f"eval_{step[3:]}" not in index:  # no checkpoint to evaluate: redo the run
            dropped.append(step)
    for step in dropped:
        index.pop(step, None)
    (runs / "index.json").write_text(json.dumps(index, indent=1))
    print(f"restored {record} into {runs}; to rebuild or redo: {', '.join(dropped) or 'nothing'}")
    return 0


def _recorded(runs: Path) -> dict[str, str]:
    """The record's sha256 of each weight file it left out (none before a record was restored)."""
    return json.loads((runs / WEIGHTS_FILE).read_text())["sha256"] if (runs / WEIGHTS_FILE).exists() else {}


def verify(runs: Path) -> int:
    """The rebuilt models against the recorded sha256: a difference is said, in machine.json's note too."""
    recorded = _recorded(runs)
    if not recorded:
        return 0
    index = json.loads((runs / "index.json").read_text())
    now = {name: sha256(path) for name, path in _model_weights(runs, index).items()}
    differ = [name for name, digest in recorded.items() if now.get(name) != digest]
    if not differ:
        print(f"rebuilt models equal the recorded ones ({len(recorded)} weight files, sha256)")
        return 0
    note = f"the rebuilt {', '.join(differ)} differ from the earlier sitting's (sha256): arms mix two start models"
    machine = runs / "machine.json"
    data = json.loads(machine.read_text()) if machine.exists() else {}
    data["rebuild_note"] = note
    machine.write_text(json.dumps(data, indent=1))
    print(f"warning: {note}", file=sys.stderr)
    return 0


def verify_warm(runs: Path) -> int:
    """Right after the warm start's rebuild: the steps it played are kept if it has the recorded sha256, else they
    are forgotten (index.json) so that the check plays them again with the rebuilt model."""
    recorded = _recorded(runs)
    warm = runs / WARM
    if WARM not in recorded or not warm.exists():
        return 0
    digest = sha256(warm)
    if digest == recorded[WARM]:
        print(f"the rebuilt warm start equals the recorded one (sha256 {digest[:12]}…): its Stage-1 episodes are kept")
        return 0
    index = json.loads((runs / "index.json").read_text())
    dropped = [s for s in PLAYED_BY_WARM if s in index]
    for step in dropped:
        del index[step]
    (runs / "index.json").write_text(json.dumps(index, indent=1))
    print(
        f"warning: the rebuilt warm start (sha256 {digest[:12]}…) differs from the record's ({recorded[WARM][:12]}…): "
        f"redoing what it played: {', '.join(dropped) or 'nothing'}",
        file=sys.stderr,
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save", help="copy $RUNS without weights into a record directory")
    s.add_argument("--runs", type=Path, required=True)
    s.add_argument("--to", type=Path, required=True)
    r = sub.add_parser("restore", help="put a record back into a fresh runs directory")
    r.add_argument("--from", dest="record", type=Path, required=True)
    r.add_argument("--runs", type=Path, required=True)
    v = sub.add_parser("verify", help="compare rebuilt model weights with the record's sha256")
    v.add_argument("--runs", type=Path, required=True)
    w = sub.add_parser("verify-warm", help="keep the steps the warm start played only if its rebuild is the same")
    w.add_argument("--runs", type=Path, required=True)
    args = ap.parse_args()
    if args.cmd == "verify-warm":
        return verify_warm(args.runs)
    if args.cmd == "save":
        return save(args.runs, args.to)
    if args.cmd == "restore":
        return restore(args.record, args.runs)
    return verify(args.runs)


if __name__ == "__main__":
    sys.exit(main())
