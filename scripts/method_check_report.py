#!/usr/bin/env python
"""Write docs/method-check.md from the run directories scripts/method_check.sh made (issue 19 §4).

Every number is read from $RUNS: machine.json, commands.jsonl, index.json, the warm start's warmstart.json, each rl
run's metrics.jsonl and config, each eval run's results.json. Nothing is typed in: the document's reading of the
figures is computed from them (a difference is called a difference only when the three paired seeds agree in sign
and its mean exceeds the evaluation's own sampling error).

    python scripts/method_check_report.py --runs runs/method-check --out docs/method-check.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seedcli.report.plots import plot_lines, read_metrics  # noqa: E402
from seedcli.report.results import load_results, paired_gain, seeds_gain  # noqa: E402

ARM_LABELS = {
    "grpo": "GRPO",
    "grpo_4x4": "GRPO, 4 games × 4",
    "seed": "SEED",
    "seed_guarded": "SEED + guards",
    "seed_opd1": "SEED, λ_opd 1.0",
    "seed_self": "SEED, self-analyzer",
    "seed_rules": "SEED, rules analyzer",
    "gigpo": "GiGPO",
    "seed_self_gigpo": "SEED (self-analyzer) on GiGPO",
    "grpo_lr1e5": "GRPO, lr 1e-5",
    "seed_self_lr1e5": "SEED, self-analyzer, lr 1e-5",
    "grpo_lr1e5_kl1": "GRPO, lr 1e-5, KL 1.0",
    "seed_self_lr1e5_kl1": "SEED, self-analyzer, lr 1e-5, KL 1.0",
    "seed_self_lr1e5_opd01": "SEED, self-analyzer, lr 1e-5, OPD 0.1",
    "seed_self_lr1e5_opd1": "SEED, self-analyzer, lr 1e-5, OPD 1.0",
    "signed_oracle_lr1e5": "signed OPD, oracle skill (privileged), lr 1e-5",
    "signed_oracle_shuffled_lr1e5": "signed OPD, another game's oracle (control), lr 1e-5",
    "seed_oracle_lr1e5": "SEED's gated OPD, oracle skill (privileged), lr 1e-5",
    "signed_self_lr1e5": "signed OPD, self-analyzer, lr 1e-5",
    "gigpo_lr1e5": "GiGPO, lr 1e-5",
    "seed_self_gigpo_lr1e5": "SEED (self-analyzer) on GiGPO, lr 1e-5",
}
# the hand-written calibration of the real model's warm start (its runs are not kept)
CALIBRATION = Path("docs/method-check-calibration.md")
# the leak and harm measures (issue 19 §2-3), the OPD statistics the SEED code logs, and two health signals
MEASURES = [
    ("skills/leak_frac", "skills that leak (the environment's rule)", "pct"),
    ("skills/leak_guarded", "skills the guard masked or dropped, per update", "num"),
    ("opd/valid_skill_frac", "episodes with a skill", "pct"),
    ("opd/token_frac", "response tokens under OPD", "pct"),
    ("opd/gate_mean", "gate σ(β·Δ) mean", "f3"),
    ("opd/gate_active_frac", "tokens with gate > 0.5", "pct"),
    ("opd/teacher_gap_mean", "teacher gap ℓ_skill − ℓ_θ mean", "f3"),
    ("opd/teacher_gap_absmax", "a reply's largest |ℓ_skill − ℓ_θ|, mean over replies", "f3"),
    ("opd/contrast_token_frac", "OPD tokens contrasted with another skill", "pct"),
    ("opd/neg_adv_push_frac", "OPD weight pushing up tokens of negative-advantage episodes", "pct"),
    ("opd/high_entropy_push_frac", "OPD weight on the batch's top-20% entropy tokens", "pct"),
    ("actor/entropy", "policy entropy", "f3"),
    ("actor/kl", "KL(θ‖ref)", "e"),
    # GiGPO's step groups (issue 29): turn-samples of a task group that acted on the same observation
    ("gigpo/state_group/mean", "GiGPO step-group size, mean", "f3"),
    ("gigpo/state_group/size_1_sample_prop", "turn-samples alone in their step group", "pct"),
]
# the per-update curves (issue 26 §4): one PNG each, a line per arm
CURVES = (
    ("rollout/success_rate", "training success", "episodes solved"),
    ("reward/mean", "reward", "mean episode reward"),
    ("opd/valid_skill_frac", "episodes with a valid skill", "share"),
    ("opd/gate_mean", "OPD gate mean", "σ(β·Δ)"),
    ("opd/teacher_gap_mean", "teacher gap", "ℓ_skill − ℓ_θ"),
)
# the Stage-1 steps of scripts/method_check.sh whose manifest metrics the report reads
STAGE1_STEPS = (
    "collect_stage1",
    "collect_heldout",
    "annotate_stage1",
    "kept_before_sft",
    "sft_stage1",
    "kept_after_sft",
)
# the Stage-1 sft's manifest metrics the report quotes
SFT_KEYS = (
    "data/train_examples",
    "train/loss_first",
    "train/loss_final",
    "val/loss_before",
    "val/loss_after",
    "timing_s/sft",
)
PHASES = ("rollout", "analyze", "rescore", "rescore_teacher", "rescore_contrast", "update", "step")


def _load_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _utc(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone


def _dur(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1); std 0 for a single value."""
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def _fmt(x: float, kind: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if kind == "pct":
        return f"{100 * x:.1f}%"
    if kind == "e":
        return f"{x:.2e}"
    if kind == "num":
        return f"{x:.2f}"
    return f"{x:.3f}"


def _pm(xs: list[float], kind: str) -> str:
    m, s = mean_std(xs)
    if math.isnan(m):
        return "—"
    if kind == "pct":
        return f"{100 * m:.1f} ± {100 * s:.1f}%"
    return f"{_fmt(m, kind)} ± {_fmt(s, kind)}"


def _where(machine: dict) -> str:
    """GPU when machine.json names one (scripts/method_check.sh records torch's first GPU), else CPU."""
    return "GPU" if machine.get("gpu") not in (None, "", "none") else "CPU"


def _local(runs: Path, run: str | None) -> str | None:
    """A run path of index.json, or the same run under `runs` when the path is gone: a record unpacked elsewhere
    (a GPU machine's archive) names the runs directory it was saved to (<stage>/<run id> at its end)."""
    if not isinstance(run, str) or Path(run).exists():
        return run
    here = runs / Path(run).parent.name / Path(run).name
    return str(here) if here.exists() else run


class Check:
    """What one method-check directory holds: its seeds and arms, the rl metrics and eval results of each."""

    def __init__(self, runs: Path):
        self.runs = runs
        self.index = {k: _local(runs, v) for k, v in json.loads((runs / "index.json").read_text()).items()}
        commands = _load_jsonl(runs / "commands.jsonl")
        last = {c["name"]: i for i, c in enumerate(commands)}  # a step redone (RESUME=1) counts once
        self.commands = [c for i, c in enumerate(commands) if last[c["name"]] == i]
        self.machine = json.loads((runs / "machine.json").read_text()) if (runs / "machine.json").exists() else {}
        config = self.machine.get("config", "configs/method_check.yaml")
        self.config_path = config
        self.config = yaml.safe_load(Path(config).read_text()) if Path(config).exists() else {}
        mc = self.config.get("method_check", {})
        self.seeds: list[int] = list(mc.get("seeds", []))
        self.arms: dict[str, str] = dict(mc.get("arms", {}))
        # the arms that ran (ARMS= may have left some of the config's out); all of them before any has run
        ran = {a: v for a, v in self.arms.items() if any(f"rl_{a}_s{s}" in self.index for s in self.seeds)}
        self.arms = ran or self.arms
        ws = runs / "models" / "agent" / "warmstart.json"
        self.warm = json.loads(ws.read_text()) if ws.exists() else None
        prov = runs / "models" / "agent" / "provenance.json"  # a pretrained model (seed model init --preset <GGUF>)
        self.provenance = json.loads(prov.read_text()) if prov.exists() else None
        self.metrics: dict[tuple[str, int], list[dict]] = {}
        self.results: dict[tuple[str, int], dict] = {}
        for arm in self.arms:
            for seed in self.seeds:
                rl = self.index.get(f"rl_{arm}_s{seed}")
                if rl and (Path(rl) / "metrics.jsonl").exists():
                    self.metrics[(arm, seed)] = read_metrics(Path(rl) / "metrics.jsonl")
                ev = self.index.get(f"eval_{arm}_s{seed}")
                if ev and (Path(ev) / "results.json").exists():
                    self.results[(arm, seed)] = load_results(ev)
        ev = self.index.get("eval_warm")
        self.warm_result = load_results(ev) if ev and (Path(ev) / "results.json").exists() else None
        # the Stage-1 sft model every arm starts from (a `stage1` section), and its own evaluation
        ev = self.index.get("eval_start")
        self.start_result = load_results(ev) if ev and (Path(ev) / "results.json").exists() else None
        self.stage1 = {step: self.manifest_metrics(step) for step in STAGE1_STEPS if self.index.get(step)}

    def manifest_metrics(self, step: str) -> dict:
        """The metrics of the manifest.json of the run that `step` made ({} when it has none)."""
        path = Path(self.index[step]) / "manifest.json"
        return dict(json.loads(path.read_text()).get("metrics", {})) if path.exists() else {}

    def start(self) -> tuple[str, dict | None]:
        """The model every arm starts from: the Stage-1 sft model when there is one, else the warm start."""
        if self.start_step() == "eval_start":
            return "the Stage-1 sft model", self.start_result
        return "the warm start", self.warm_result

    def start_step(self) -> str:
        """The step that evaluated the model every arm starts from (see `start`)."""
        return "eval_start" if "sft_stage1" in self.index else "eval_warm"

    def plays(self, arm: str, seed: int) -> dict[str, tuple[tuple[str, ...], bool]] | None:
        """Each test game's (actions played, solved) in the eval of `arm`'s final model at `seed` (episodes.jsonl)."""
        return self.plays_of(f"eval_{arm}_s{seed}")

    def plays_of(self, step: str) -> dict[str, tuple[tuple[str, ...], bool]] | None:
        """Each test game's (actions played, solved) in the eval that `step` made (None without its episodes)."""
        run = self.index.get(step)
        path = Path(run) / "episodes.jsonl" if run else None
        if path is None or not path.exists():
            return None
        out = {}
        for row in _load_jsonl(path):
            out[row["task_id"]] = (tuple(t["action"] for t in row["turns"]), bool(row["won"]))
        return out

    def success(self, arm: str, seed: int) -> float | None:
        r = self.results.get((arm, seed))
        return None if r is None else float(r["micro_success"])

    def per_run(self, arm: str, key: str) -> list[float]:
        """The mean of `key` over the updates of each seed's run of `arm` (runs without it left out)."""
        out = []
        for seed in self.seeds:
            rows = [r[key] for r in self.metrics.get((arm, seed), []) if isinstance(r.get(key), (int, float))]
            if rows:
                out.append(statistics.fmean(rows))
        return out


def _analyzer_of(args: str) -> str:
    """The `--analyzer` value in an arm's command-line arguments ("none" when it has none)."""
    words = args.split()
    return words[words.index("--analyzer") + 1] if "--analyzer" in words[:-1] else "none"


def episodes_of(result: dict) -> int:
    return int(sum(c.get("games", c.get("episodes", 0)) for c in result["categories"].values()))


class Doc:
    def __init__(self, check: Check, out: Path):
        self.c = check
        self.out = out
        self.fig_dir = out.parent / out.stem
        self.lines: list[str] = []
        self.noise = math.nan  # one evaluation's binomial standard error (set by `evals`)
        self.readings: list[str] = []  # the paired differences in words (set by `paired`)
        self.moved: dict[str, float] = {}  # per arm, the share of test games played unlike GRPO (set by `divergence`)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    # ------------------------------------------------------------------------------------------------ sections

    def header(self) -> None:
        c, m = self.c, self.c.machine
        spans = [(_utc(x["finished_utc"]) - x["seconds"], _utc(x["finished_utc"])) for x in c.commands]
        elapsed = max(e for _, e in spans) - min(s for s, _ in spans) if spans else None
        total = sum(x["seconds"] for x in c.commands)
        self.add(
            f"# Method check on {_where(m)}: {'; '.join(ARM_LABELS.get(a, a) for a in c.arms)}; "
            f"{len(c.seeds)} seed(s) each",
            "",
            f"<!-- generated by scripts/method_check_report.py from {c.runs.as_posix()}/ — do not edit; rerun "
            "`make method-check` -->",
            "",
            "The reproduction guide's *method smoke test*, with variance: does the trajectory → hindsight skill → "
            "token-level OPD → policy update chain change what a policy learns, beyond seed-to-seed noise, and what "
            "do the leak and harm measures say while it runs? "
            + (
                f"{c.provenance.get('model', 'A pretrained model')} (from {c.provenance.get('package')} "
                f"{c.provenance.get('package_version')}'s GGUF, no model hub) is "
                if c.provenance
                else "A tiny model (built in code, no model hub) is "
            )
            + "behaviour-cloned on the environment's expert so that it solves some games; then, from that one "
            f"checkpoint, each of {len(c.seeds)} seeds trains {len(c.arms)} arms ("
            + ", ".join(f"{ARM_LABELS.get(a, a)}: `{args}`" for a, args in c.arms.items())
            + "), and every final model plays the same test games. This is a mechanism check: model, data and "
            "number of updates are far from the paper's (the table below lists what was shrunk), so no number here "
            "is comparable with the paper's tables.",
            "",
            "## Machine and run",
            "",
            "| | |",
            "|---|---|",
            f"| CPU | {m.get('cpu', '—')} ({m.get('cores', '—')} cores, shared with other work) |",
            f"| Memory | {m.get('memory_gib', '—')} GiB |",
            f"| GPU | {m.get('gpu', '—')} |",
            f"| Threads per process | {m.get('omp_num_threads', '—')} |",
            f"| Steps side by side | {m.get('jobs', '—')} |",
            f"| Load average at start | {', '.join(f'{x:.1f}' for x in m.get('load_avg_at_start', []))} |",
            f"| Started (UTC) | {m.get('started_utc', '—')} |",
            f"| Config | `{c.config_path}` |",
            f"| Wall time, first command to last | {_dur(elapsed)} |",
            f"| Sum of the steps' wall times | {_dur(total)} |",
            *([f"| Note | {m['note']} |"] if m.get("note") else []),
            *([f"| Rebuilt models | {m['rebuild_note']} |"] if m.get("rebuild_note") else []),
            "",
            "## Commands",
            "",
            "`make method-check` runs `scripts/method_check.sh`, which ran these commands (the environment sets "
            "`OMP_NUM_THREADS=1`, `HF_HUB_OFFLINE=1`; `$RUNS` is the runs directory):",
            "",
            "| step | command | wall time |",
            "|---|---|--:|",
        )
        runs = c.runs.as_posix()
        for x in c.commands:
            cmd = (x["command"] + " ").replace(runs + "/", "$RUNS/").replace(runs + " ", "$RUNS ").strip()
            status = "" if x.get("rc", 0) == 0 else f" (**failed, rc {x['rc']}**)"
            self.add(f"| {x['name']} | `{cmd.replace('|', chr(92) + '|')}` | {_dur(x['seconds'])}{status} |")
        if any(x["name"] == "warmstart_reused" for x in c.commands) and c.warm:
            w = c.warm
            self.add(
                "",
                f"The warm-start model was reused (`WARM_FROM`): trained before this run by `seed model init --preset "
                f"tiny --warm-start expert --env {w.get('env', 'alfworld')} --tasks {w['games']} --epochs "
                f"{w['epochs']} --seed {w['seed']} --no-skill-writing` in {_dur(w['wall_time_s'])} (its "
                "warmstart.json), then copied; a plain `make method-check` trains it afresh.",
            )
        self.add("")

    def shrunk(self) -> None:
        c = self.c
        rl = c.config.get("rl", {})
        ev = c.config.get("eval", {})
        env = c.config.get("env", "sokoban")
        paper_config = Path(f"configs/{env}/paper_qwen25vl_3b.yaml")
        paper = yaml.safe_load(paper_config.read_text()) if paper_config.exists() else {}
        prl = paper.get("rl", {})
        w = c.warm or {}
        params = w.get("parameters")
        observation = (c.config.get("env_options") or {}).get("observation", "text")
        analyzers = sorted({_analyzer_of(args) for args in c.arms.values()} - {"none"})
        collect = c.config.get("collect", {})
        stage1 = (
            f"collect ({collect.get('tasks')} games × {collect.get('rollouts')}) "
            "→ the rules analyzer annotates (no offline machine reaches GLM) → SFT on those skills"
            if c.config.get("stage1") is not None
            else "skipped: RL starts from the warm start"
        )
        self.add(
            "## What was shrunk",
            "",
            f"| | this check | the paper's {env} run (`{paper_config.as_posix()}`) |",
            "|---|---|---|",
            f"| policy | {c.provenance['model'] if c.provenance else 'tiny Qwen2 built in code'}, "
            f"{params / 1e6:.2f}M parameters, behaviour-cloned on the expert "
            f"({w.get('games')} games, {w.get('epochs')} epochs) | Qwen2.5-VL-3B-Instruct after Stage-1 SFT |"
            if params
            else "| policy | — | Qwen2.5-VL-3B-Instruct |",
            f"| observation | {observation} | {paper.get('env_options', {}).get('observation', '—')} |",
            f"| Stage 1 (collect → annotate → SFT) | {stage1} | GLM-annotated skills, SFT |",
            f"| analyzer of the SEED arms | {', '.join(f'`--analyzer {a}`' for a in analyzers) or '—'} | the policy "
            "itself (`--analyzer self`) |",
            f"| updates × games × group | {rl.get('steps')} × {rl.get('batch_tasks')} × {rl.get('group')} | "
            f"{prl.get('steps')} × {prl.get('batch_tasks')} × {prl.get('group')} |",
            f"| turns, history | {rl.get('max_steps', '—')}, {rl.get('history', '—')} | {prl.get('max_steps')}, "
            f"{prl.get('history')} |",
            f"| reply tokens | {rl.get('max_new_tokens')} | {prl.get('max_new_tokens')} |",
            f"| learning rate, mini-batch | {rl.get('lr')}, {rl.get('mini_batch')} | {prl.get('lr')}, "
            f"{prl.get('mini_batch')} |",
            f"| rollout temperature | {rl.get('temperature')} | {prl.get('temperature', 1.0)} |",
            f"| evaluation | the first {ev.get('limit')} test games, temperature {ev.get('temperature')} | "
            f"{prl.get('val_tasks', prl.get('val_games', '—'))} games at 0.4 |",
            f"| seeds | {len(c.seeds)} per arm | one run per row |",
            "",
        )

    def warm_start(self) -> None:
        c = self.c
        w = c.warm
        self.add("## 1. Warm start", "")
        if not w:
            self.add("No warmstart.json: the warm start did not finish.", "")
            return
        ch = w.get("check", {})
        self.add(
            f"`seed model init --warm-start expert --env {w.get('env')}`: {w['method']}. The expert plays "
            f"{w['games']} training games ({w['games_won_by_expert']} solved; with probability {w['noise']} a turn "
            "plays a random move, and every turn is labelled with the expert's move at that state); the model "
            f"learns the {w['turns']} acting turns of the solved games for {w['epochs']} epochs (prompt tokens mean "
            f"{w['prompt_tokens_mean']:.0f}). Response NLL {w['first_response_nll']:.3f} → "
            f"{w['last_response_nll']:.3f}; {_dur(w['train_s'])} of training on {w['threads']} thread(s). Greedy "
            f"on {ch.get('turns')} demonstration states: well-formed {100 * ch.get('valid_rate', 0):.1f}%, the "
            f"expert's own move {100 * ch.get('expert_action_rate', 0):.1f}%."
            + (
                f" How this amount of cloning was chosen (a start that leaves room to learn): `{CALIBRATION}`."
                if CALIBRATION.exists() and c.provenance
                else ""
            )
            + (f" (warmstart.json: {w['note']}.)" if w.get("note") else ""),
            "",
        )

    def stage1(self) -> None:
        st = self.c.stage1
        if not st:
            return
        self.add("## 1b. Stage 1: the policy learns to write its own skills", "")
        col, held = st.get("collect_stage1", {}), st.get("collect_heldout", {})
        ann, sft = st.get("annotate_stage1", {}), st.get("sft_stage1", {})
        a_cfg = self.c.config.get("annotate", {})
        self.add(
            f"The warm start plays {col.get('episodes', '?')} training episodes (solved "
            f"{_fmt(col.get('success_rate', math.nan), 'pct')}); the `{a_cfg.get('analyzer', 'rules')}` "
            f"analyzer writes a hindsight skill for {ann.get('annotate/kept', '?')} of its "
            f"{ann.get('annotate/trajectories', '?')} trajectories (the paper used GLM-5.2, which no offline machine "
            "reaches); `seed sft` teaches the clone to write that skill JSON. The policy analyzer's kept fraction "
            "(skills that parse and pass the judge) is read on "
            f"{held.get('episodes', '?')} held-out episodes of other training games, before and after the sft:",
            "",
            "| policy analyzer on held-out episodes | kept | kept fraction |",
            "|---|--:|--:|",
        )
        for step, label in (("kept_before_sft", "the warm start"), ("kept_after_sft", "after the Stage-1 sft")):
            m = st.get(step)
            if m:
                self.add(
                    f"| {label} | {m.get('annotate/kept')}/{m.get('annotate/trajectories')} | "
                    f"{_fmt(m.get('annotate/kept_fraction', math.nan), 'pct')} |"
                )
        self.add("")
        if sft:
            keys = [k for k in SFT_KEYS if k in sft]
            if keys:
                self.add("Sft: " + ", ".join(f"`{k}` {sft[k]}" for k in keys) + ".", "")

    def gain(self) -> None:
        """Each arm's gain over the model it started from, with the standard error of that difference."""
        c = self.c
        label, start = c.start()
        if start is None or not c.results:
            return
        n0 = episodes_of(start)
        p0 = float(start["micro_success"])
        self.add(
            "## 2b. Gain over the start",
            "",
            f"Every arm starts from {label}, which solves **{100 * p0:.1f}%** ({round(p0 * n0)}/{n0}) of the same "
            "test games. Gain = the arm's mean over seeds − the start. Its standard error combines the start's "
            "binomial error √(p₀(1−p₀)/n) with the seed mean's: the seeds' spread s/√k when there are two or more "
            "seeds (training noise and evaluation noise together), else the one evaluation's binomial error.",
            "",
            "| arm | seeds | mean success | gain (points) | standard error | gain / SE |",
            "|---|--:|--:|--:|--:|--:|",
        )
        for arm in c.arms:
            vals = [v for v in (c.success(arm, s) for s in c.seeds) if v is not None]
            if not vals:
                continue
            n = episodes_of(c.results[next(k for k in c.results if k[0] == arm)])
            m, g, se = seeds_gain(vals, p0, n0, n)
            ratio = g / se if se > 0 else math.nan
            self.readings.append(
                f"{ARM_LABELS.get(arm, arm)} − start: {100 * g:+.1f} ± {100 * se:.1f} points over {len(vals)} seed(s) "
                + ("(beyond twice its standard error)" if abs(ratio) > 2 else "(within twice its standard error)")
            )
            self.add(
                f"| {ARM_LABELS.get(arm, arm)} | {len(vals)} | {100 * m:.1f}% | {100 * g:+.1f} | {100 * se:.1f} | "
                f"{ratio:+.2f} |"
            )
        self.add("")
        self.gain_per_seed()

    def gain_per_seed(self) -> None:
        """Each run's gain over the start on the same test games, with the paired standard error of that one run's
        difference (game by game: solved after − solved before), and how many seeds are beyond twice it."""
        c = self.c
        before = c.plays_of(c.start_step())
        if not before:
            return
        rows = []
        for arm in c.arms:
            cells, up, down, done = [], 0, 0, 0
            for seed in c.seeds:
                after = c.plays(arm, seed)
                games = sorted(set(before) & set(after or {}))
                if not games:
                    cells.append("—")
                    continue
                d = [int(after[g][1]) - int(before[g][1]) for g in games]
                g, se = paired_gain(d)
                done += 1
                up += g > 2 * se
                down += g < -2 * se
                cells.append(f"{100 * g:+.1f} ± {100 * se:.1f}")
            if done:
                rows.append(f"| {ARM_LABELS.get(arm, arm)} | " + " | ".join(cells) + f" | {up} up, {down} down, of {done} |")
        if not rows:
            return
        self.add(
            "Each run on its own: its final model and the start played the same test games, so the gain of one run "
            "has a paired standard error, sd(dᵢ)/√n over the games' differences dᵢ = solved after − solved before "
            "(a game both solved or both missed adds 0). This is the evaluation's noise "
            "only: whether a recipe learns is the table above, whose error includes the seeds' spread.",
            "",
            "| arm | " + " | ".join(f"seed {s}" for s in c.seeds) + " | runs beyond 2 SE |",
            "|---|" + "--:|" * (len(c.seeds) + 1),
            *rows,
            "",
        )

    def evals(self) -> None:
        c = self.c
        self.add("## 2. Test success per seed and arm", "")
        if not c.results:
            self.add("No evaluation finished.", "")
            return
        any_result = next(iter(c.results.values()))
        n = episodes_of(any_result)
        ev = c.config.get("eval", {})
        self.add(
            f"Each final model plays the same {n} test games once (ordinary prompt, no skill; temperature "
            f"{ev.get('temperature')}, ≤{ev.get('max_steps')} turns); success = games solved.",
            "",
        )
        if c.warm_result is not None:
            p = float(c.warm_result["micro_success"])
            self.add(f"The warm start itself: **{100 * p:.1f}%** ({round(p * n)}/{n}).", "")
        head = "| arm | " + " | ".join(f"seed {s}" for s in c.seeds) + " | mean ± std |"
        self.add(head, "|---|" + "--:|" * (len(c.seeds) + 1))
        for arm in c.arms:
            vals = [c.success(arm, s) for s in c.seeds]
            cells = [f"{100 * v:.1f}%" if v is not None else "—" for v in vals]
            self.add(
                f"| {ARM_LABELS.get(arm, arm)} | "
                + " | ".join(cells)
                + f" | {_pm([v for v in vals if v is not None], 'pct')} |"
            )
        p = statistics.fmean(v for v in (c.success(a, s) for a in c.arms for s in c.seeds) if v is not None)
        self.noise = math.sqrt(p * (1 - p) / n) if n else math.nan
        self.add(
            "",
            f"Sampling error of one evaluation: at the mean success {100 * p:.1f}% over {n} games the binomial "
            f"standard error is {100 * self.noise:.1f} points, so two models differ beyond it only when their gap "
            f"exceeds about {100 * 2 * math.sqrt(2) * self.noise:.1f} points (2 standard errors of a difference).",
            "",
        )

    def paired(self) -> None:
        c = self.c
        arms = list(c.arms)
        if not any(a == "grpo" or a.startswith("grpo_") for a in arms) or not c.results:
            return
        pairs = [(a, "grpo") for a in arms if a != "grpo"] if "grpo" in arms else []
        # a GRPO variant `grpo<sfx>` is also the baseline of the other arms named `…<sfx>` (seed_self_lr1e5 against
        # grpo_lr1e5: the same change on both sides)
        for b in arms:
            sfx = b[len("grpo") :] if b.startswith("grpo_") else ""
            pairs += [(a, b) for a in arms if sfx and a.endswith(sfx) and not a.startswith("grpo")]
        if "seed" in arms and "seed_guarded" in arms:
            pairs.append(("seed_guarded", "seed"))
        # an arm `X_shuffled…` is the control of `X…` (another task's skill in the teacher's prompt): their difference
        # is what the skill's information did
        pairs += [(a.replace("_shuffled", ""), a) for a in arms if "_shuffled" in a and a.replace("_shuffled", "") in arms]
        self.add(
            "## 3. Paired differences (same seed: same warm start, same games drawn at each update)",
            "",
            "| difference | " + " | ".join(f"seed {s}" for s in c.seeds) + " | mean ± std | reading |",
            "|---|" + "--:|" * (len(c.seeds) + 1) + "---|",
        )
        for a, b in pairs:
            diffs = []
            cells = []
            for s in c.seeds:
                x, y = c.success(a, s), c.success(b, s)
                if x is None or y is None:
                    cells.append("—")
                    continue
                diffs.append(x - y)
                cells.append(f"{100 * (x - y):+.1f}")
            m, sd = mean_std(diffs)
            same_sign = len(diffs) == len(c.seeds) and (all(d > 0 for d in diffs) or all(d < 0 for d in diffs))
            beyond = not math.isnan(m) and abs(m) > 2 * math.sqrt(2) * self.noise
            if not diffs:
                reading = "—"
            elif all(d == 0 for d in diffs):
                reading = "the same success in every seed"
            elif same_sign and beyond:
                reading = f"{'higher' if m > 0 else 'lower'} in every seed, beyond the evaluation's noise"
            elif same_sign:
                reading = "same sign in every seed, within the evaluation's noise"
            elif len(diffs) < len(c.seeds):  # an unfinished check: a missing seed is not a disagreement
                agree = all(d > 0 for d in diffs) or all(d < 0 for d in diffs)
                reading = (f"{len(diffs)} of {len(c.seeds)} seeds finished"
                           + (f", {'higher' if m > 0 else 'lower'} in each" if agree else ", signs differ")
                           + ": no reading until all have")
            else:
                reading = "the seeds do not agree in sign: no difference shown"
            label = f"{ARM_LABELS.get(a, a)} − {ARM_LABELS.get(b, b)}"
            spread = f"{100 * m:+.1f} ± {100 * sd:.1f}" if diffs else "—"
            if diffs:
                self.readings.append(f"{label}: {spread} points ({reading})")
            self.add(f"| {label} (points) | " + " | ".join(cells) + f" | {spread} | {reading} |")
        self.add("")

    def divergence(self) -> None:
        """How far each arm's final model drifted from GRPO's at the same seed: test games played with another move
        sequence, and games whose outcome differs (same games, same sampling seed)."""
        c = self.c
        if "grpo" not in c.arms:
            return
        rows = []
        for a in c.arms:
            if a == "grpo":
                continue
            moved, flipped = [], []
            for s in c.seeds:
                mine, base = c.plays(a, s), c.plays("grpo", s)
                if not mine or not base:
                    continue
                games = sorted(set(mine) & set(base))
                moved.append(sum(mine[r][0] != base[r][0] for r in games) / len(games))
                flipped.append(sum(mine[r][1] != base[r][1] for r in games) / len(games))
            if moved:
                rows.append((a, moved, flipped))
        if not rows:
            return
        self.add(
            "## 3b. How far each arm moved from GRPO",
            "",
            "The evaluation samples with the same seed for every model, so two final models that assign nearly the "
            "same probabilities play the same moves. Per seed, the share of test games where the arm's final model "
            "played a different move sequence than GRPO's, and where the outcome differs (solved by one, not the "
            "other); mean ± std over the seeds.",
            "",
            "| arm | games played differently | games with another outcome |",
            "|---|--:|--:|",
        )
        for a, moved, flipped in rows:
            self.moved[a] = statistics.fmean(moved)
            self.add(f"| {ARM_LABELS.get(a, a)} | {_pm(moved, 'pct')} | {_pm(flipped, 'pct')} |")
        self.add("")

    def training(self) -> None:
        c = self.c
        if not c.metrics:
            return
        self.add(
            "## 4. Training",
            "",
            "Per run, the mean over its updates; then mean ± std over the seeds.",
            "",
            "| | " + " | ".join(ARM_LABELS.get(a, a) for a in c.arms) + " |",
            "|---|" + "--:|" * len(c.arms),
        )
        for key, label, kind in (
            ("rollout/success_rate", "training success", "pct"),
            ("reward/mean", "reward", "f3"),
            ("env/episode_length", "episode length", "num"),
            ("env/invalid_rate", "invalid replies", "pct"),
        ):
            self.add(f"| {label} (`{key}`) | " + " | ".join(_pm(c.per_run(a, key), kind) for a in c.arms) + " |")
        last = []
        for a in c.arms:
            vals = [c.metrics[(a, s)][-1].get("rollout/success_rate") for s in c.seeds if (a, s) in c.metrics]
            last.append(_pm([v for v in vals if v is not None], "pct"))
        self.add("| training success, last update | " + " | ".join(last) + " |", "")
        # one curve per arm and measure, per update, mean over seeds
        figures = []
        for key, title, ylabel in CURVES:
            lines = []
            for a in c.arms:
                runs = [c.metrics[(a, s)] for s in c.seeds if (a, s) in c.metrics]
                runs = [r for r in runs if any(isinstance(row.get(key), (int, float)) for row in r)]
                if not runs:
                    continue
                steps = min(len(r) for r in runs)
                xs = list(range(1, steps + 1))
                ys = [statistics.fmean(float(r[i].get(key) or 0.0) for r in runs) for i in range(steps)]
                lines.append((xs, ys, ARM_LABELS.get(a, a), None))
            if lines:
                self.fig_dir.mkdir(parents=True, exist_ok=True)
                name = key.replace("/", "_") + ".png"
                path = plot_lines(
                    lines,
                    self.fig_dir / name,
                    title=f"{title} per update (mean over seeds)",
                    xlabel="update",
                    ylabel=ylabel,
                )
                figures.append(f"![{title}]({path.relative_to(self.out.parent).as_posix()})")
        self.add(*(f for fig in figures for f in (fig, "")))

    def measures(self) -> None:
        c = self.c
        if not c.metrics:
            return
        self.add(
            "## 5. Leak and harm measures",
            "",
            "Per run, the mean over its updates; then mean ± std over the seeds. `skills/leak_frac` is the share "
            "of the update's skills that the environment's leak rule flags (Sokoban: four or more of the "
            "episode's own moves written in a row); the guard arm masks those spans before the teacher pass and "
            "contrasts each skill with another episode's (`opd/contrast_token_frac` is how often one differed). "
            "GRPO has no skills and no OPD: its cells are 0 or —.",
            "",
            "| measure | " + " | ".join(ARM_LABELS.get(a, a) for a in c.arms) + " |",
            "|---|" + "--:|" * len(c.arms),
        )
        for key, label, kind in MEASURES:
            self.add(f"| {label} (`{key}`) | " + " | ".join(_pm(c.per_run(a, key), kind) for a in c.arms) + " |")
        self.add("")

    def cost(self) -> None:
        c = self.c
        if not c.metrics:
            return
        self.add(
            "## 6. Cost per update",
            "",
            "Mean seconds per update (`timing_s/*`), mean ± std over the seeds; `rescore_teacher` (the skill-context "
            "pass) and `rescore_contrast` (the other episode's skill) are parts of `rescore`, and `step` is the whole "
            f"update. Runs shared the {'GPU' if _where(c.machine) == 'GPU' else 'CPU cores'} "
            f"{c.machine.get('jobs', 2)} at a time, so the absolute times carry that load.",
            "",
            "| phase | " + " | ".join(ARM_LABELS.get(a, a) for a in c.arms) + " |",
            "|---|" + "--:|" * len(c.arms),
        )
        for phase in PHASES:
            self.add(f"| {phase} | " + " | ".join(_pm(c.per_run(a, f"timing_s/{phase}"), "num") for a in c.arms) + " |")
        samples = " | ".join(_pm(c.per_run(a, "rollout/turn_samples"), "num") for a in c.arms)
        self.add(f"| turn-samples per update | {samples} |", "")
        if "grpo" in c.arms:
            ratios = []
            for a in c.arms:
                if a == "grpo":
                    continue
                per_seed = []
                for s in c.seeds:
                    x, y = (c.metrics.get((a, s)), c.metrics.get(("grpo", s)))
                    if not x or not y:
                        continue
                    tx = statistics.fmean(r["timing_s/step"] / max(r.get("rollout/turn_samples", 1), 1) for r in x)
                    ty = statistics.fmean(r["timing_s/step"] / max(r.get("rollout/turn_samples", 1), 1) for r in y)
                    per_seed.append(tx / ty)
                if per_seed:
                    m, sd = mean_std(per_seed)
                    ratios.append(f"{ARM_LABELS.get(a, a)} / GRPO **{m:.2f}× ± {sd:.2f}**")
            self.add(
                "Time per turn-sample, paired by seed (episode lengths differ between arms, so per update would "
                "mix in how long the episodes were): " + "; ".join(ratios) + ".",
                "",
            )

    def reading(self) -> None:
        self.add("## 7. What this shows", "")
        for r in self.readings:
            self.add(f"- {r}.")
        c = self.c
        for a, share in self.moved.items():
            same = [
                [r.get("rollout/success_rate") for r in c.metrics[(a, s)]]
                == [r.get("rollout/success_rate") for r in c.metrics[("grpo", s)]]
                for s in c.seeds
                if (a, s) in c.metrics and ("grpo", s) in c.metrics
            ]
            self.add(
                f"- {ARM_LABELS.get(a, a)}: the final model played {100 * share:.0f}% of the test games differently "
                "from GRPO's at the same seed (mean over seeds); its training success equalled GRPO's at every update "
                f"in {sum(same)} of {len(same)} seeds"
                + (
                    " (the same games and sampling seeds: a policy that moved little samples the same moves)."
                    if any(same)
                    else "."
                )
            )
        skill_arms = [a for a in c.arms if a != "grpo"]
        leaks = [v for a in skill_arms for v in c.per_run(a, "skills/leak_frac")]
        guarded = [v for a in skill_arms for v in c.per_run(a, "skills/leak_guarded")]
        if leaks and max(leaks) == 0.0:
            self.add(
                "- No skill leaked in any run (`skills/leak_frac` 0 in every update: no skill wrote the episode's "
                "moves)"
                + (" and the guard masked nothing (`skills/leak_guarded` 0)" if guarded and max(guarded) == 0.0 else "")
                + "."
            )
        elif leaks:
            self.add(f"- Skills leaked in some updates: `skills/leak_frac` up to {100 * max(leaks):.1f}% (run means).")
        for a in skill_arms:
            contrast = c.per_run(a, "opd/contrast_token_frac")
            if contrast and max(contrast) > 0:
                self.add(
                    f"- {ARM_LABELS.get(a, a)}: the contrast found another episode's differing skill for "
                    f"{100 * statistics.fmean(contrast):.0f}% of the OPD tokens (mean over runs)."
                )
        rl = c.config.get("rl", {})
        policy = f"{c.provenance['model']}" if c.provenance else "a tiny policy built in code"
        self.add(
            f"- The figures above are all there is: {policy}, {rl.get('steps')} updates of "
            f"{rl.get('batch_tasks', 0) * rl.get('group', 0)} episodes, rules-annotated Stage-1 skills. A difference "
            f"that the {len(c.seeds)} seeds do not agree on, or that sits inside the evaluation's sampling error, "
            "is not evidence for or against SEED at scale.",
            "",
        )

    def write(self) -> Path:
        self.header()
        self.shrunk()
        self.warm_start()
        self.stage1()
        self.evals()
        self.gain()
        self.paired()
        self.divergence()
        self.training()
        self.measures()
        self.cost()
        self.reading()
        self.out.write_text("\n".join(self.lines).rstrip() + "\n")
        return self.out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=Path("runs/method-check"), help="runs directory of method_check.sh")
    ap.add_argument("--out", type=Path, default=Path("docs/method-check.md"), help="the document to write")
    ap.add_argument(
        "--note",
        default=None,
        help="a sentence on how the run went (load, sessions), kept in $RUNS/machine.json and shown under the run",
    )
    args = ap.parse_args()
    if not (args.runs / "index.json").exists():
        print(f"error: {args.runs}/index.json not found; run scripts/method_check.sh first", file=sys.stderr)
        return 2
    if args.note:
        machine_file = args.runs / "machine.json"
        machine = json.loads(machine_file.read_text()) if machine_file.exists() else {}
        machine_file.write_text(json.dumps({**machine, "note": args.note}, indent=1))
    print(Doc(Check(args.runs), args.out).write())
    return 0


if __name__ == "__main__":
    sys.exit(main())
