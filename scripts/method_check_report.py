"""Regenerate docs/method-check.md and docs/method-check/*.png from the run directories of scripts/method_check.sh.

    python scripts/method_check_report.py --runs runs/method-check --out docs/method-check.md

Every number in the document is read from the runs (machine.json, commands.jsonl, index.json, the warm start's
warmstart.json, the stages' manifests, metrics.jsonl, samples.jsonl and the evals' results.json); nothing is typed
by hand. The prose that says what moved is chosen by comparing those numbers with their sampling error.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from statistics import mean, median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seedcli.reporting import (  # noqa: E402
    compare_runs,
    load_results,
    plot_histogram,
    plot_lines,
    read_metrics,
)

RL_RUNS = (("GRPO", "rl_grpo"), ("SEED", "rl_seed"))
EVALS = (("warm start", "eval_warm"), ("GRPO", "eval_grpo"), ("SEED", "eval_seed"))
TIMING_PARTS = ("rollout", "analyze", "rescore", "rescore_teacher", "update", "sync")


def _load_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a half-written last line
    return out


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _utc(stamp: str) -> float:
    """Seconds since the epoch of a commands.jsonl time stamp ("2026-11-29T13:26:28Z")."""
    from datetime import UTC, datetime

    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _dur(s: float | None) -> str:
    if s is None:
        return "—"
    s = float(s)
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def _manifest(run: str | None) -> dict:
    if not run:
        return {}
    path = Path(run) / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _quantiles(xs: list[float], qs=(0.05, 0.25, 0.5, 0.75, 0.95)) -> list[float]:
    s = sorted(xs)
    return [s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] for q in qs]


def _se(wins: int, n: int) -> float:
    """Standard error of a success rate, with the rate shrunk towards 1/2 by one pseudo-game (never 0 at 0/n)."""
    p = (wins + 0.5) / (n + 1)
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def _delta_hist(deltas: list[float], path: Path, title: str, color: str, log: bool = False) -> Path:
    """Histogram of per-token Δ = ℓ_skill − ℓ_old with a line at 0."""
    return plot_histogram(
        deltas,
        path,
        title=title,
        xlabel="Δ = ℓ_skill − ℓ_old (nats)",
        ylabel="response tokens (log)" if log else "response tokens",
        color=color,
        log=log,
    )


def stage1_shift(runs: Path, episodes: int = 8) -> Path:
    """Score shift of the same sampled tokens under ordinary and skill contexts, on Stage-1 data: the collect run's
    episodes (sampled by the warm-started policy), each with the skill the Stage-1 analyzer wrote for it, re-scored
    by that same policy without and with the skill block. Writes $RUNS/stage1_shift.json."""
    from seedcli.engines.hf import HFEngine
    from seedcli.envs.alfworld import insert_skill
    from seedcli.records import SkillRecord, Trajectory, iter_jsonl

    index = json.loads((runs / "index.json").read_text())
    collect, annotate = Path(index["collect"]), Path(index["annotate"])
    skills = {s.episode_id: s for s in iter_jsonl(annotate / "skills.jsonl", SkillRecord) if s.episode_skill}
    trajectories = [t for t in iter_jsonl(collect / "trajectories.jsonl", Trajectory) if t.episode_id in skills]
    won = [t for t in trajectories if t.won][: episodes // 2]
    lost = [t for t in trajectories if not t.won][: episodes - len(won)]
    model_dir = runs / "models" / "agent"
    engine = HFEngine(model_dir, device="cpu", max_batch=8)
    out = []
    t0 = time.time()
    for traj in won + lost:
        skill = skills[traj.episode_id].episode_skill
        turns = [t for t in traj.turns if t.response_ids]
        plain = [engine.render([{"role": "user", "content": t.prompt}]) for t in turns]
        with_skill = [engine.render([{"role": "user", "content": insert_skill(t.prompt, skill)}]) for t in turns]
        old = engine.score(plain, [t.response_ids for t in turns])
        new = engine.score(with_skill, [t.response_ids for t in turns])
        out.append(
            {
                "episode_id": traj.episode_id,
                "task": traj.task,
                "task_type": traj.task_type,
                "won": traj.won,
                "length": traj.length,
                "skill": skill,
                "turns": [
                    {
                        "turn": t.step,
                        "action": t.action,
                        "tokens": [engine.tokenizer.decode([i]) for i in t.response_ids],
                        "old_logp": a,
                        "skill_logp": b,
                        "shift": [y - x for x, y in zip(a, b, strict=True)],
                    }
                    for t, a, b in zip(turns, old, new, strict=True)
                ],
            }
        )
    engine.close()
    path = runs / "stage1_shift.json"
    meta = {"model": str(model_dir), "collect": str(collect), "annotate": str(annotate), "seconds": time.time() - t0}
    path.write_text(json.dumps({**meta, "episodes": out}))
    return path


class Doc:
    def __init__(self, runs: Path, out: Path):
        self.runs = runs
        self.out = out
        self.fig_dir = out.parent / out.stem
        self.fig_dir.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []
        self.index = json.loads((runs / "index.json").read_text()) if (runs / "index.json").exists() else {}
        # a step redone in a later session (RESUME=1) counts once: its last entry
        commands = _load_jsonl(runs / "commands.jsonl")
        last = {c["name"]: i for i, c in enumerate(commands)}
        self.commands = [c for i, c in enumerate(commands) if last[c["name"]] == i]
        self.machine = json.loads((runs / "machine.json").read_text()) if (runs / "machine.json").exists() else {}
        ws = runs / "models" / "agent" / "warmstart.json"
        self.warm = json.loads(ws.read_text()) if ws.exists() else None
        self.metrics = {}
        for label, key in RL_RUNS:
            run = self.index.get(key)
            if run and (Path(run) / "metrics.jsonl").exists():
                self.metrics[label] = read_metrics(Path(run) / "metrics.jsonl")
        self.results = {}
        for label, key in EVALS:
            for split in ("seen", "unseen"):
                run = self.index.get(f"{key}_{split}")
                if run and (Path(run) / "results.json").exists():
                    self.results[(label, split)] = load_results(run)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.out.parent).as_posix()

    # ------------------------------------------------------------------------------------------------ sections

    def header(self) -> None:
        m = self.machine
        total = sum(c["seconds"] for c in self.commands)
        # elapsed: first start to last finish (side-by-side steps overlap, so it is less than the sum of step times)
        spans = [
            (_utc(c["finished_utc"]) - c["seconds"], _utc(c["finished_utc"]))
            for c in self.commands
            if c.get("finished_utc")
        ]
        elapsed = max(end for _, end in spans) - min(start for start, _ in spans) if spans else None
        self.add(
            "# Method check on CPU: a warm-started tiny agent, GRPO and SEED side by side",
            "",
            "<!-- generated by scripts/method_check_report.py from "
            f"{self.runs.as_posix()}/ — do not edit; rerun `make method-check` -->",
            "",
            "The reproduction guide's *method smoke test*: show the trajectory → hindsight skill → token-level OPD → "
            "policy-update chain working on real ALFWorld games, and the score shift of the same sampled actions "
            "under ordinary and skill contexts. A tiny model (built in code, no model hub) is first behaviour-cloned "
            "on ALFWorld's searching expert (and taught to write skill JSON) so that it wins some games, the RL "
            "rewards are not all zero and its self-analyzer can answer. "
            "This is a mechanism check: model, data and number of updates are far from the paper's, so no number "
            "here is comparable with the paper's tables.",
            "",
            "## Machine and run",
            "",
            "| | |",
            "|---|---|",
            f"| CPU | {m.get('cpu', '—')} ({m.get('cores', '—')} cores, shared with other work) |",
            f"| Memory | {m.get('memory_gib', '—')} GiB |",
            f"| GPU | {m.get('gpu', '—')} |",
            f"| Threads per process | {m.get('omp_num_threads', '—')} |",
            f"| Load average at start | {', '.join(f'{x:.1f}' for x in m.get('load_avg_at_start', []))} |",
            f"| Independent steps side by side | {'yes (the two RL runs; the seen/unseen evals)' if m.get('parallel') == '1' else 'no (one after the other)'} |",
            f"| Started (UTC) | {m.get('started_utc', '—')} |",
            f"| Config | `{m.get('config', '—')}` |",
            f"| Wall time, first command to last | {_dur(elapsed) if elapsed is not None else '—'} |",
            f"| Sum of the steps' wall times | {_dur(total)} |",
            "",
            "## Commands",
            "",
            "`make method-check` runs `scripts/method_check.sh`, which ran these commands (the environment sets "
            "`OMP_NUM_THREADS`, `HF_HUB_OFFLINE=1`; `$RUNS` is the runs directory):",
            "",
            "| step | command | wall time |",
            "|---|---|--:|",
        )
        for c in self.commands:
            runs = self.runs.as_posix()
            cmd = (c["command"] + " ").replace(runs + "/", "$RUNS/").replace(runs + " ", "$RUNS ").strip()
            cmd = cmd.replace("|", "\\|")
            status = "" if c.get("rc", 0) == 0 else f" (**failed, rc {c['rc']}**)"
            self.add(f"| {c['name']} | `{cmd}` | {_dur(c['seconds'])}{status} |")
        reused = next((c for c in self.commands if c["name"] == "warmstart_reused"), None)
        if reused and self.warm:
            w = self.warm
            self.add(
                "",
                f"The warm-start model was reused (`WARM_FROM`): it was trained before this run by `seed model init "
                f"--preset tiny --warm-start expert --games {w['games']} --epochs {w['epochs']} --seed {w['seed']}` "
                f"in {_dur(w['wall_time_s'])} (its warmstart.json), then copied; a plain `make method-check` "
                "trains it afresh.",
            )
        self.add("")

    def warm_start(self) -> None:
        w = self.warm
        self.add("## 1. Warm start (behaviour cloning of the searching expert, plus skill writing)", "")
        if not w:
            self.add("The warm start did not finish: no warmstart.json.", "")
            return
        shape = w["shape"]
        noise = w.get("noise")
        self.add(
            "`seed model init --preset tiny --warm-start expert` lets ALFWorld's hand-coded expert play the "
            "training games from the first step, through the same rollout loop as `seed collect`, so every "
            "demonstration is the exact agent prompt of that state. This expert does not know where anything is: it "
            "searches the receptacles where the object class can be, so what it does depends only on what the agent "
            "sees (a clone of the stored walkthroughs memorises where the object was in its own game)."
            + (
                f" With probability {noise:g} a turn plays a random admissible action instead; every turn is "
                "labelled with the expert's action *at that state*, so the clone also learns to recover."
                if noise
                else ""
            )
            + " The response is a short template thought (whether the agent holds the task's object, sees it "
            'here or is still looking for it: "I see the tomato here.") plus that action. '
            + (
                f"{w['skill_examples']} skill-writing examples join them: the analysis prompt that `--analyzer self` "
                f"renders for a demonstration episode (at most {w['analysis_max_chars']} characters) → the `rules` "
                "analyzer's JSON skill for it, so the policy can write skills about its own episodes. "
                if w.get("skill_examples")
                else ""
            )
            + f"The model learns next-token NLL on the response tokens, plus weight {w['prompt_weight']:g} on the "
            "prompt tokens (it starts from random weights and must learn the game's language to copy an admissible "
            "action out of the prompt).",
            "",
            "| | |",
            "|---|---|",
            f"| Model | Qwen2 architecture, hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers, "
            f"{shape['num_attention_heads']}/{shape['num_key_value_heads']} heads, MLP {shape['intermediate_size']}, "
            f"byte-level BPE vocabulary {shape['vocab_size']}: {w['parameters'] / 1e6:.2f}M parameters |",
            f"| Demonstrations | {w['games']} training games (expert won {w['games_won_by_expert']}), "
            f"{w['turns']} acting turns from the won games"
            + (f", {w['skill_examples']} skill-writing examples" if w.get("skill_examples") else "")
            + f", {w['response_tokens']} response tokens |",
            f"| Prompt length | mean {w['prompt_tokens_mean']:.0f}, max {w['prompt_tokens_max']} tokens "
            f"(history {w['history']}) |",
            f"| Training | {w['epochs']} epoch(s), AdamW lr {w['lr']:g} (warm-up, cosine), {w['batch_tokens']} tokens "
            f"a batch, prompt-token weight {w['prompt_weight']:g} |",
            f"| Time | expert demonstrations {_dur(w['demos_s'])} (cached for reruns), training "
            f"{_dur(w['train_s'])}, {w['threads']} thread(s) |",
            f"| Response NLL | first batch {w['first_response_nll']:.3f} → per epoch "
            + " → ".join(f"{x:.3f}" for x in w["epoch_response_nll"])
            + f" → last 20 batches {w['last_response_nll']:.3f} |",
            f"| Greedy check on {w['check']['turns']} demonstration prompts | well-formed "
            f"{_pct(w['check']['valid_rate'])}, admissible {_pct(w['check']['admissible_rate'])}, "
            f"the expert's own action {_pct(w['check']['expert_action_rate'])} |",
        )
        sc = w.get("skill_check")
        if sc:
            self.add(
                f"| Greedy skill JSON for {sc['episodes']} held-out demonstration episodes | parseable and kept by "
                f"rl's parser: {sc['kept']}/{sc['episodes']} |"
            )
        self.add("")
        curve = w.get("curve") or []
        if curve:
            steps = [c["step"] for c in curve]
            path = plot_lines(
                [
                    (steps, [c["response_nll"] for c in curve], "response NLL", None),
                    (steps, [c["loss"] for c in curve], "training loss (with prompt tokens)", 0.6),
                ],
                self.fig_dir / "warmstart_loss.png",
                title="Warm start: behaviour-cloning loss",
                xlabel="batch",
                ylabel="nats / token",
            )
            self.add(f"![warm-start loss]({self.rel(path)})", "")
        examples = w["check"].get("examples") or []
        if examples:
            self.add("Greedy responses on demonstration prompts (expert action → model response):", "")
            for ex in examples:
                self.add(f"- `{ex['expert']}` → `{ex['model'].replace(chr(10), ' ')}`")
            self.add("")
        skill_examples = (w.get("skill_check") or {}).get("examples") or []
        if skill_examples:
            self.add("Greedy skill JSON on a held-out episode's analysis prompt:", "")
            ex = skill_examples[0]
            self.add(f"- kept: {'yes' if ex['kept'] else 'no'}: `{ex['model'][:400].replace(chr(10), ' ')}`", "")

    def stage1(self) -> None:
        self.add("## 2. Stage 1: collect → annotate → sft", "")
        col = _manifest(self.index.get("collect")).get("metrics", {})
        ann = _manifest(self.index.get("annotate")).get("metrics", {})
        sft_run = self.index.get("sft")
        sft = _manifest(sft_run).get("metrics", {})
        if not col:
            self.add("Stage 1 did not finish.", "")
            return
        cfg = _manifest(self.index.get("collect")).get("config", {})
        self.add(
            f"The warm-started policy played {col.get('games')} training games × {col.get('rollouts')} rollouts "
            f"(temperature {cfg.get('temperature')}, ≤{cfg.get('max_steps')} steps): **train success "
            f"{_pct(col.get('success_rate'))}** of {col.get('episodes')} episodes, mean length "
            f"{_f(col.get('mean_length'), '{:.1f}')}, invalid turns {_pct(col.get('invalid_rate'))}. "
            "The paper's external analyzer (GLM-5.2) is not reachable here; the offline `rules` analyzer stands in "
            "for it and writes a workflow skill for successes and an avoidance rule for failures.",
            "",
        )
        if ann:
            keys = [k for k in ann if isinstance(ann[k], (int, float)) and not isinstance(ann[k], bool)]
            self.add("Annotate: " + ", ".join(f"{k} {_f(ann[k], '{:g}')}" for k in keys[:8]) + ".", "")
        if sft:
            keys = (
                "data/train_examples",
                "data/val_examples",
                "train/steps",
                "train/loss_first",
                "train/loss_final",
                "val/loss_before",
                "val/loss_after",
                "timing_s/sft",
            )
            cfg = _manifest(sft_run).get("config", {})
            self.add(
                f"SFT (the policy learns to write the skill JSON; {cfg.get('epochs')} epochs, lr {cfg.get('lr')}): "
                + ", ".join(f"{k} {_f(sft[k], '{:.4g}')}" for k in keys if k in sft)
                + ".",
                "",
            )

    def evals(self) -> None:
        self.add("## 3. Evaluation: warm start, GRPO and SEED", "")
        if not self.results:
            self.add("No evaluation finished.", "")
            return
        cfg = {}
        for _, key in EVALS:
            cfg = _manifest(self.index.get(f"{key}_seen")).get("config", {}) or cfg
        self.add(
            f"Every game of the split once, ordinary prompt (no skill), temperature {cfg.get('temperature')}, "
            f"≤{cfg.get('max_steps')} steps. Success per task type (wins/games) and the macro average over types.",
            "",
        )
        for split in ("seen", "unseen"):
            rows = [(label, self.results[(label, split)]) for label, _ in EVALS if (label, split) in self.results]
            if not rows:
                continue
            table = compare_runs(rows).splitlines()
            table = [ln for ln in table if not ln.startswith("# ")]
            self.add(f"### {split}", "", *table, "")

    def curves(self) -> None:
        self.add("## 4. Training curves (`seed plot`)", "")
        if not self.metrics:
            self.add("No RL metrics.", "")
            return
        plots = self.runs / "plots"
        if (plots / "curves.png").exists():
            for png in sorted(plots.glob("*.png")):
                shutil.copyfile(png, self.fig_dir / png.name)
            self.add(f"![training curves]({self.rel(self.fig_dir / 'curves.png')})", "")
        keys = [
            ("reward/mean", "{:.2f}"),
            ("rollout/success_rate", None),
            ("env/episode_length", "{:.1f}"),
            ("env/invalid_rate", None),
            ("actor/kl", "{:.2e}"),
            ("actor/entropy", "{:.3f}"),
        ]
        steps = sorted({int(r["step"]) for recs in self.metrics.values() for r in recs})
        head = "| update | " + " | ".join(f"{label} {k}" for k, _ in keys for label in self.metrics) + " |"
        self.add(head, "|---|" + "--:|" * (len(keys) * len(self.metrics)))
        by_step = {label: {int(r["step"]): r for r in recs} for label, recs in self.metrics.items()}
        for s in steps:
            cells = []
            for k, fmt in keys:
                for label in self.metrics:
                    v = by_step[label].get(s, {}).get(k)
                    cells.append(_pct(v) if fmt is None and v is not None else _f(v, fmt or "{}"))
            self.add(f"| {s} | " + " | ".join(cells) + " |")
        self.add("")
        for label, recs in self.metrics.items():
            rewards = [r.get("reward/mean", 0.0) for r in recs]
            wins = sum(r.get("rollout/success_rate", 0.0) * r.get("rollout/episodes", 0) for r in recs)
            eps = sum(r.get("rollout/episodes", 0) for r in recs)
            self.add(
                f"- {label}: {len(recs)} updates, {eps:.0f} training episodes, {wins:.0f} won "
                f"({_pct(wins / eps if eps else None)}); reward/mean from {_f(min(rewards), '{:.2f}')} to "
                f"{_f(max(rewards), '{:.2f}')} across updates; skipped updates "
                f"{sum(1 for r in recs if r.get('actor/skipped'))}."
            )
        self.add("")

    def opd(self) -> tuple[list[float], dict | None]:
        self.add("## 5. OPD statistics (SEED run)", "")
        recs = self.metrics.get("SEED")
        if not recs:
            self.add("No SEED metrics.", "")
            return [], None
        self.add(
            "| update | valid self-generated skill | gate mean | Δ mean (masked tokens) | ℓ_skill − ℓ_old mean "
            "| OPD loss | OPD token fraction | analyzer rejections |",
            "|---|--:|--:|--:|--:|--:|--:|---|",
        )
        for r in recs:
            rej = ", ".join(f"{k.split('/')[-1]} {int(v)}" for k, v in r.items() if k.startswith("analyzer/rejected/"))
            self.add(
                f"| {int(r['step'])} | {_pct(r.get('opd/valid_skill_frac'))} | {_f(r.get('opd/gate_mean'))} | "
                f"{_f(r.get('opd/delta_mean'))} | {_f(r.get('opd/shift_mean'))} | {_f(r.get('opd/loss'))} | "
                f"{_pct(r.get('opd/token_frac'))} | {rej or '—'} |"
            )
        valid = [r.get("opd/valid_skill_frac", 0.0) * r.get("rollout/episodes", 0) for r in recs]
        eps = sum(r.get("rollout/episodes", 0) for r in recs)
        self.add(
            "",
            f"Over the run, **{_pct(sum(valid) / eps if eps else None)}** of {eps:.0f} episodes got a valid "
            "self-generated skill (parseable JSON with a skill of at least five words).",
            "",
        )

        samples = (
            _load_jsonl(Path(self.index.get("rl_seed", "")) / "samples.jsonl") if self.index.get("rl_seed") else []
        )
        deltas, gates = [], []
        for rec in samples:
            for t in rec.get("turns", []):
                deltas.extend(t.get("shift") or [])
                gates.extend(t.get("gate") or [])
        chosen = None
        if deltas:
            q = _quantiles(deltas)
            pos = sum(d > 0 for d in deltas) / len(deltas)
            self.add(
                f"Δ = ℓ_skill − ℓ_old per response token, over the {sum(1 for r in samples if r.get('skill'))} logged "
                f"episodes with a skill ({len(deltas)} tokens; one episode is logged per update): mean "
                f"{mean(deltas):.4f}, quantiles 5/25/50/75/95% = "
                + " / ".join(f"{x:.4f}" for x in q)
                + f"; {_pct(pos)} of tokens are raised by the skill context; gate σ(βΔ) mean {mean(gates):.3f}, "
                f"median {median(gates):.3f}.",
                "",
            )
            path = _delta_hist(
                deltas,
                self.fig_dir / "delta_hist.png",
                "Score shift of the sampled tokens under the skill context (SEED, logged episodes)",
                "tab:orange",
            )
            self.add(f"![Δ distribution]({self.rel(path)})", "")
            with_skill = [r for r in samples if r.get("skill") and any(t.get("shift") for t in r.get("turns", []))]
            # the inspected episode: a won one with a skill if there is one, else the latest with a skill
            chosen = next((r for r in reversed(with_skill) if r.get("won")), with_skill[-1] if with_skill else None)
        elif samples:
            self.add("The logged SEED episodes carry no skill-context scores (no valid self-generated skill).", "")
        return deltas, chosen

    def stage1_shift_section(self) -> None:
        path = self.runs / "stage1_shift.json"
        self.add("## 5b. Score shift on Stage-1 data: the same sampled tokens, ordinary vs skill context", "")
        if not path.exists():
            self.add("Not computed (no stage1_shift.json).", "")
            return
        data = json.loads(path.read_text())
        eps = data["episodes"]
        deltas = [d for e in eps for t in e["turns"] for d in t["shift"]]
        if not deltas:
            self.add("No scored tokens.", "")
            return
        won = [d for e in eps if e["won"] for t in e["turns"] for d in t["shift"]]
        lost = [d for e in eps if not e["won"] for t in e["turns"] for d in t["shift"]]
        q = _quantiles(deltas)
        self.add(
            f"The {len(eps)} first collect episodes with a Stage-1 skill ({sum(e['won'] for e in eps)} won), sampled "
            "by the warm-started policy, re-scored by that same policy under the ordinary prompt (ℓ_old) and with "
            "the episode's skill from the Stage-1 (rules) analyzer inserted after the task line (ℓ_skill) — the "
            "teacher pass of SEED, with the Stage-1 analyzer standing in for the self-analyzer. "
            f"Δ = ℓ_skill − ℓ_old over {len(deltas)} response tokens: mean {mean(deltas):.4f}, mean |Δ| "
            f"{mean(abs(x) for x in deltas):.4f}, quantiles 5/25/50/75/95% = "
            + " / ".join(f"{x:.4f}" for x in q)
            + f"; {_pct(sum(d > 0 for d in deltas) / len(deltas))} of tokens raised; gate σ(5Δ) mean "
            f"{mean(1 / (1 + math.exp(-max(-60, min(60, 5 * d)))) for d in deltas):.3f}. Won episodes: mean Δ "
            f"{_f(mean(won) if won else None, '{:.4f}')}; lost: {_f(mean(lost) if lost else None, '{:.4f}')}. "
            f"Computed in {_dur(data['seconds'])}.",
            "",
        )
        fig_path = _delta_hist(
            deltas,
            self.fig_dir / "stage1_delta_hist.png",
            "Stage-1 episodes: score shift under the analyzer's skill",
            "tab:green",
            log=True,
        )
        self.add(f"![Stage-1 Δ distribution]({self.rel(fig_path)})", "")
        self.stage1_episode = next((e for e in eps if e["won"]), eps[0])

    def timing(self) -> None:
        self.add("## 6. Cost: time per update, SEED over GRPO", "")
        if len(self.metrics) < 2:
            self.add("Needs both RL runs.", "")
            return
        rows = {}
        for label, recs in self.metrics.items():
            rows[label] = {p: mean(r.get(f"timing_s/{p}", 0.0) for r in recs) for p in (*TIMING_PARTS, "step")}
        g, s = rows["GRPO"], rows["SEED"]
        self.add(
            "Mean seconds per update (`timing_s/*` in metrics.jsonl):", "", "| phase | GRPO | SEED |", "|---|--:|--:|"
        )
        for p in (*TIMING_PARTS, "step"):
            self.add(f"| {p} | {g[p]:.1f} | {s[p]:.1f} |")
        turns = {label: mean(r.get("rollout/turn_samples", 0) for r in recs) for label, recs in self.metrics.items()}
        per_turn = {k: rows[k]["step"] / turns[k] if turns[k] else float("nan") for k in rows}
        self.add(
            "",
            f"SEED / GRPO time per update: **{s['step'] / g['step']:.2f}×**; per turn-sample ("
            f"{turns['GRPO']:.0f} vs {turns['SEED']:.0f} turn-samples per update on average): "
            f"**{per_turn['SEED'] / per_turn['GRPO']:.2f}×**. SEED's extra work is the self-analyzer "
            f"({s['analyze']:.1f} s) and the skill-context re-scoring ({s['rescore_teacher']:.1f} s of "
            f"{s['rescore']:.1f} s re-scoring).",
        )
        if self.machine.get("parallel") == "1":
            self.add(
                "",
                "The two runs shared the machine side by side (and with other users' jobs), so the absolute "
                "times carry the machine's load; the ratio compares runs that saw the same load.",
            )
        self.add("")

    def episode(self, chosen: dict | None) -> None:
        self.add("## 7. One inspected episode: per-token ℓ_skill − ℓ_old", "")
        if not chosen:
            chosen = getattr(self, "stage1_episode", None)
            if not chosen:
                self.add("No logged episode with a skill.", "")
                return
            self.add(
                "No SEED update logged an episode with a valid self-generated skill, so the episode shown is from "
                "Stage 1 (section 5b): sampled by the warm-started policy, skill from the Stage-1 analyzer.",
                "",
            )
            chosen = {
                **chosen,
                "step": "Stage 1",
                "turns": [
                    {
                        **t,
                        "advantage": float("nan"),
                        "gate": [1 / (1 + math.exp(-max(-60, min(60, 5 * d)))) for d in t["shift"]],
                    }
                    for t in chosen["turns"]
                ],
            }
        where = chosen["step"] if isinstance(chosen["step"], str) else f"Update {chosen['step']}"
        whose = (
            "Its hindsight skill from the Stage-1 analyzer:"
            if isinstance(chosen["step"], str)
            else ("The policy's own hindsight skill for it:")
        )
        self.add(
            f"{where}, episode `{chosen['episode_id']}` ({chosen['task_type']}): *{chosen['task']}* — "
            f"{'won' if chosen['won'] else 'lost'} in {chosen['length']} steps. {whose}",
            "",
            f"> {chosen['skill']}",
            "",
            "Each response token with ℓ_old (ordinary prompt), ℓ_skill (skill inserted after the task line) and "
            "Δ = ℓ_skill − ℓ_old; the gate is σ(βΔ). `seed inspect RUN --step N` shows the same in colour.",
            "",
        )
        shown = [t for t in chosen["turns"] if t.get("shift")][:3]
        for t in shown:
            adv = "" if math.isnan(t["advantage"]) else f", advantage {t['advantage']:.3f}"
            self.add(
                f"Turn {t['turn']}: action `{t['action']}`{adv}",
                "",
                "| token | ℓ_old | ℓ_skill | Δ | gate |",
                "|---|--:|--:|--:|--:|",
            )
            for tok, a, b, d, gt in zip(
                t["tokens"], t["old_logp"], t["skill_logp"], t["shift"], t["gate"], strict=False
            ):
                shown_tok = tok.replace("|", "\\|").replace("\n", "\\n").replace("`", "'")
                self.add(f"| `{shown_tok}` | {a:.3f} | {b:.3f} | {d:+.3f} | {gt:.3f} |")
            self.add("")
        rest = [t for t in chosen["turns"] if t.get("shift")][3:]
        if rest:
            self.add(
                "Later turns, Δ summed over the action's tokens: "
                + "; ".join(f"turn {t['turn']} `{t['action']}` {sum(t['shift']):+.3f}" for t in rest)
                + ".",
                "",
            )

    def verdict(self, deltas: list[float]) -> None:
        self.add("## 8. What moved and what did not", "")
        out = []
        if self.warm:
            seen = self.results.get(("warm start", "seen"))
            out.append(
                f"The warm start learned its demonstrations (response NLL {self.warm['first_response_nll']:.2f} → "
                f"{self.warm['last_response_nll']:.2f}) and "
                + (f"wins {seen['wins']} of {seen['episodes']} seen games." if seen else "was not evaluated.")
            )
        for split in ("seen", "unseen"):
            base = self.results.get(("warm start", split))
            for label in ("GRPO", "SEED"):
                r = self.results.get((label, split))
                if not (base and r):
                    continue
                d = (r["micro_success"] or 0) - (base["micro_success"] or 0)
                se = math.hypot(_se(base["wins"], base["episodes"]), _se(r["wins"], r["episodes"]))
                moved = abs(d) > 2 * se
                out.append(
                    f"{label} vs the warm start on {split}: {r['wins']}/{r['episodes']} vs {base['wins']}/"
                    f"{base['episodes']} games ({d * 100:+.1f} points; two standard errors {200 * se:.1f} points): "
                    + ("a difference larger than sampling noise." if moved else "within sampling noise — no change.")
                )
            g, s = self.results.get(("GRPO", split)), self.results.get(("SEED", split))
            if g and s:
                d = (s["micro_success"] or 0) - (g["micro_success"] or 0)
                se = math.hypot(_se(g["wins"], g["episodes"]), _se(s["wins"], s["episodes"]))
                out.append(
                    f"SEED vs GRPO on {split}: {d * 100:+.1f} points (two standard errors {200 * se:.1f}): "
                    + (
                        "SEED ahead beyond noise."
                        if d > 2 * se
                        else "GRPO ahead beyond noise."
                        if d < -2 * se
                        else "no difference that this sample size can show."
                    )
                )
        for label, recs in self.metrics.items():
            rewards = [r.get("reward/mean", 0.0) for r in recs]
            nonzero = sum(1 for r in recs if r.get("rollout/success_rate", 0) > 0)
            out.append(
                f"{label} rewards are non-degenerate in {nonzero} of {len(recs)} updates (at least one won "
                f"episode in the batch); mean reward over updates {mean(rewards):.2f}."
            )
        seed_recs = self.metrics.get("SEED") or []
        if seed_recs and not any(r.get("opd/valid_skill_frac", 0) > 0 for r in seed_recs):
            out.append(
                "The self-analyzer wrote no valid skill in any update, so SEED's OPD term was masked out everywhere: "
                "in this run SEED is GRPO plus the analyzer's cost, and the chain stops at the skill step."
            )
        g_recs = self.metrics.get("GRPO") or []
        if g_recs and seed_recs and len(g_recs) == len(seed_recs):
            same = all(
                a.get(k) == b.get(k)
                for a, b in zip(g_recs, seed_recs, strict=True)
                for k in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "actor/kl")
            )
            if same:
                out.append(
                    f"GRPO and SEED are identical in all {len(g_recs)} updates (reward, policy loss, gradient norm "
                    "and KL equal to the last digit): same seed and start, and an OPD term that was zero, so the "
                    "loop is deterministic and SEED added nothing but cost here."
                )
        if deltas:
            out.append(
                f"The OPD signal is present and non-zero: the skill context shifts the sampled tokens' log-probs by a "
                f"mean of {mean(deltas):.4f} nats (mean |Δ| {mean(abs(x) for x in deltas):.4f}); with λ_opd at the "
                "paper's 0.01 and only a few updates, its effect on the policy is expected to be small."
            )
        else:
            out.append(
                "No skill-context scores were logged during RL, so the OPD update was not exercised in this run."
            )
        shift_path = self.runs / "stage1_shift.json"
        if shift_path.exists():
            eps = json.loads(shift_path.read_text())["episodes"]
            d1 = [d for e in eps for t in e["turns"] for d in t["shift"]]
            if d1:
                raised = sum(d > 0 for d in d1) / len(d1)
                out.append(
                    f"The teacher pass itself works (section 5b): on Stage-1 episodes the skill context moves the "
                    f"same sampled tokens by a mean of {mean(d1):+.4f} nats, raising {_pct(raised)} of them. "
                    + (
                        "The shift is mostly downward: a policy never trained with a skill block in its prompt is "
                        "perturbed by it rather than guided, so a gated OPD would mostly ignore these tokens."
                        if mean(d1) < 0 and raised < 0.5
                        else "The shift is mostly upward: the skill context endorses the sampled tokens."
                    )
                )
        self.add(*[f"- {x}" for x in out], "")
        self.add(
            "Caveats that hold whatever the numbers: the analyzer of Stage 1 is the offline rules analyzer, not an "
            "LLM; the tiny policy writes skills only as well as the warm start's skill-writing examples and a small "
            "SFT, both on that analyzer's output, teach it; the RL runs "
            "have a handful of updates on a few games each (the paper: 150 updates × 16 games × 8 rollouts) with a "
            "larger learning rate than the paper's; evaluation samples at a non-zero temperature, so small "
            "differences between models are noise.",
            "",
        )

    def write(self) -> Path:
        self.header()
        self.warm_start()
        self.stage1()
        self.evals()
        self.curves()
        deltas, chosen = self.opd()
        self.stage1_shift_section()
        self.timing()
        self.episode(chosen)
        self.verdict(deltas)
        self.out.write_text("\n".join(self.lines).rstrip() + "\n")
        return self.out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=Path("runs/method-check"), help="runs directory of method_check.sh")
    ap.add_argument("--out", type=Path, default=Path("docs/method-check.md"), help="the document to write")
    ap.add_argument("--shift-only", action="store_true", help="only compute $RUNS/stage1_shift.json (needs torch)")
    args = ap.parse_args()
    if not (args.runs / "index.json").exists():
        print(f"error: {args.runs}/index.json not found; run scripts/method_check.sh first", file=sys.stderr)
        return 2
    if args.shift_only:
        print(stage1_shift(args.runs))
        return 0
    path = Doc(args.runs, args.out).write()
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
