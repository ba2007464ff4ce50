"""scripts/method_check_report.py on a hand-made method-check directory (2 seeds × 2 arms): the per-arm mean ± std,
the paired differences and their reading, the measures and the cost ratio, each against a hand computation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers_cli import load_script


@pytest.fixture(scope="module")
def report():
    return load_script("method_check_report")


def _eval(path: Path, wins: int, games: int, plays: list[tuple[str, bool]] | None = None) -> str:
    path.mkdir(parents=True)
    rows = [
        {"task_id": f"r{i}", "won": won, "turns": [{"action": a} for a in actions.split()]}
        for i, (actions, won) in enumerate(plays or [])
    ]
    (path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = {
        "schema_version": 2, "env": "sokoban", "split": "test", "macro_success": wins / games,
        "micro_success": wins / games, "categories": {"sokoban": {"games": games, "wins": wins}},
    }  # fmt: skip
    (path / "results.json").write_text(json.dumps(result))
    return str(path)


def _rl(path: Path, rows: list[dict]) -> str:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(rows)))
    return str(path)


def _check_dir(tmp_path: Path, config_text: str) -> Path:
    """An empty method-check directory whose machine.json names a config holding `config_text`."""
    runs = tmp_path / "runs"
    config = tmp_path / "mc.yaml"
    config.write_text(config_text)
    runs.mkdir()
    (runs / "machine.json").write_text(json.dumps({"config": str(config), "jobs": 2}))
    return runs


def _write_report(report, runs: Path, tmp_path: Path) -> str:
    out = tmp_path / "doc" / "method-check.md"
    out.parent.mkdir()
    return report.Doc(report.Check(runs), out).write().read_text()


def test_report_computes_spreads_pairs_and_costs(report, tmp_path):
    runs = _check_dir(
        tmp_path,
        "env: sokoban\nmethod_check:\n  seeds: [0, 1]\n  arms:\n    grpo: '--algo grpo'\n    seed: '--algo seed'\n"
        "    seed_guarded: '--algo seed leak_guard=mask'\n"
        "rl: {steps: 2}\neval: {limit: 100, temperature: 0.4, max_steps: 15}\n",
    )
    wins = {
        ("grpo", 0): 20,
        ("grpo", 1): 30,
        ("seed", 0): 40,
        ("seed", 1): 44,
        ("seed_guarded", 0): 25,
        ("seed_guarded", 1): 25,
    }
    index = {}
    for (arm, seed), w in wins.items():
        # four logged rooms: SEED plays room 0 differently at both seeds, and changes its outcome at seed 0 only
        plays = [("up left", False), ("down", True), ("right", False), ("up", True)]
        if arm == "seed":
            plays[0] = ("down left", seed == 0)
        index[f"eval_{arm}_s{seed}"] = _eval(runs / "eval" / f"{arm}{seed}", w, 100, plays)
        step = 10.0 if arm == "grpo" else 12.0 + seed  # seconds per update, 100 turn-samples each
        leak = 0.0 if arm == "grpo" else 0.25 * (seed + 1)
        index[f"rl_{arm}_s{seed}"] = _rl(
            runs / "rl" / f"{arm}{seed}",
            [{"timing_s/step": step, "rollout/turn_samples": 100, "skills/leak_frac": leak,
              "rollout/success_rate": 0.1 * (k + 1)} for k in range(2)],
        )  # fmt: skip
    (runs / "index.json").write_text(json.dumps(index))
    (runs / "commands.jsonl").write_text(
        json.dumps(
            {"name": "rl_grpo_s0", "command": "seed rl", "seconds": 60.0, "finished_utc": "2026-12-02T01:00:00Z"}
        )
        + "\n"
    )
    text = _write_report(report, runs, tmp_path)
    # GRPO 20%, 30%: mean 25.0, sample std 7.1; SEED 40%, 44%: mean 42.0, std 2.8
    assert "| GRPO | 20.0% | 30.0% | 25.0 ± 7.1% |" in text
    assert "| SEED | 40.0% | 44.0% | 42.0 ± 2.8% |" in text
    # paired SEED − GRPO: +20, +14 → mean +17.0, std 4.2; both positive; noise at the mean p = 184/600 = 0.3067,
    # n = 100: se = sqrt(.3067·.6933/100) = 4.61 points, 2·√2·se = 13.0 < 17.0 → beyond the noise
    assert (
        "| SEED − GRPO (points) | +20.0 | +14.0 | +17.0 ± 4.2 | higher in every seed, beyond the evaluation's noise |"
        in text
    )
    assert "standard error is 4.6 points" in text
    # guarded − GRPO: +5, −5 → the seeds disagree; guarded − SEED: −15, −19 → lower in every seed, beyond the noise
    assert (
        "| SEED + guards − GRPO (points) | +5.0 | -5.0 | +0.0 ± 7.1 | the seeds do not agree in sign: no difference shown |"
        in text
    )
    assert (
        "| SEED + guards − SEED (points) | -15.0 | -19.0 | -17.0 ± 2.8 | lower in every seed, beyond the evaluation's noise |"
        in text
    )
    # rooms played differently from GRPO: 1/4 at both seeds; another outcome: 1/4, 0/4 → 12.5 ± 17.7%
    assert "| SEED | 25.0 ± 0.0% | 12.5 ± 17.7% |" in text
    assert "| SEED + guards | 0.0 ± 0.0% | 0.0 ± 0.0% |" in text
    # leak_frac per run: seed 0.25, 0.5 → 37.5 ± 17.7%; GRPO 0
    assert "37.5 ± 17.7%" in text
    # time per turn-sample, SEED / GRPO paired: 1.2, 1.3 → 1.25 ± 0.07
    assert "SEED / GRPO **1.25× ± 0.07**" in text


def test_mean_std_is_the_sample_std(report):
    assert report.mean_std([1.0]) == (1.0, 0.0)
    m, s = report.mean_std([0.1, -0.1, 0.3])
    assert m == pytest.approx(0.1) and s == pytest.approx(0.2)


def _stage(path: Path, metrics: dict) -> str:
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"metrics": metrics}))
    return str(path)


def test_report_gives_stage1_kept_fractions_and_the_gain_over_the_start(report, tmp_path):
    runs = _check_dir(
        tmp_path,
        "env: ezpoints\nmethod_check:\n  seeds: [0, 1]\n  arms:\n    grpo: '--algo grpo'\n    seed_self: '--algo seed'\n"
        "annotate: {analyzer: rules}\neval: {limit: 100, temperature: 0.4}\n",
    )
    index = {
        "collect_stage1": _stage(runs / "c1", {"episodes": 64, "success_rate": 0.25}),
        "collect_heldout": _stage(runs / "c2", {"episodes": 16, "success_rate": 0.25}),
        "annotate_stage1": _stage(runs / "a1", {"annotate/kept": 60, "annotate/trajectories": 64}),
        "kept_before_sft": _stage(
            runs / "k0", {"annotate/kept": 3, "annotate/trajectories": 16, "annotate/kept_fraction": 0.1875}
        ),
        "sft_stage1": _stage(runs / "s1", {"data/train_examples": 54, "val/loss_after": 0.5}),
        "kept_after_sft": _stage(
            runs / "k1", {"annotate/kept": 15, "annotate/trajectories": 16, "annotate/kept_fraction": 0.9375}
        ),
        "eval_start": _eval(runs / "eval" / "start", 15, 100),
        "eval_warm": _eval(runs / "eval" / "warm", 14, 100),
    }
    for (arm, seed), w in {("grpo", 0): 20, ("grpo", 1): 30, ("seed_self", 0): 40, ("seed_self", 1): 44}.items():
        index[f"eval_{arm}_s{seed}"] = _eval(runs / "eval" / f"{arm}{seed}", w, 100)
        index[f"rl_{arm}_s{seed}"] = _rl(
            runs / "rl" / f"{arm}{seed}",
            [{"timing_s/step": 10.0, "rollout/turn_samples": 100, "rollout/success_rate": 0.1 * (k + 1),
              "reward/mean": 0.2 * k, "opd/gate_mean": 0.5} for k in range(3)],
        )  # fmt: skip
    (runs / "index.json").write_text(json.dumps(index))
    (runs / "commands.jsonl").write_text("")
    text = _write_report(report, runs, tmp_path)
    assert "| the warm start | 3/16 | 18.8% |" in text
    assert "| after the Stage-1 sft | 15/16 | 93.8% |" in text
    assert "writes a hindsight skill for 60 of its 64 trajectories" in text
    # start 15/100; GRPO 20%, 30%: gain +10.0, se = sqrt(var(.2,.3)/2 + .15·.85/100) = sqrt(.0025 + .001275) = 6.1
    assert "Every arm starts from the Stage-1 sft model, which solves **15.0%** (15/100)" in text
    assert "| GRPO | 2 | 25.0% | +10.0 | 6.1 | +1.63 |" in text
    # SEED 40%, 44%: gain +27.0, se = sqrt(.0008/2 + .001275) = 4.1, 27.0 / 4.09 = 6.60
    assert "| SEED, self-analyzer | 2 | 42.0% | +27.0 | 4.1 | +6.60 |" in text
    assert "GRPO − start: +10.0 ± 6.1 points over 2 seed(s) (within twice its standard error)" in text
    # one PNG per curve that some run logged; the gate curve even though GRPO's rows carry it here too
    figs = {p.name for p in (tmp_path / "doc" / "method-check").glob("*.png")}
    assert figs == {"rollout_success_rate.png", "reward_mean.png", "opd_gate_mean.png"}


def test_report_gives_each_runs_paired_gain_over_the_start(report, tmp_path):
    runs = _check_dir(
        tmp_path,
        "env: ezpoints\nmethod_check:\n  seeds: [0, 1]\n  arms:\n    grpo: '--algo grpo'\neval: {limit: 4}\n",
    )
    # the start solves games 0 and 1 of 4; seed 0 solves 0, 1, 2, 3 (d = 0, 0, 1, 1); seed 1 solves 1 (d = -1, 0, 0, 0)
    start = [("a", True), ("a", True), ("a", False), ("a", False)]
    s0 = [("a", True), ("a", True), ("a", True), ("a", True)]
    s1 = [("a", False), ("a", True), ("a", False), ("a", False)]
    index = {
        "sft_stage1": _stage(runs / "s1", {}),
        "eval_start": _eval(runs / "eval" / "start", 2, 4, start),
        "eval_grpo_s0": _eval(runs / "eval" / "g0", 4, 4, s0),
        "eval_grpo_s1": _eval(runs / "eval" / "g1", 1, 4, s1),
        "rl_grpo_s0": _rl(runs / "rl" / "g0", [{"timing_s/step": 1.0}]),
        "rl_grpo_s1": _rl(runs / "rl" / "g1", [{"timing_s/step": 1.0}]),
    }
    (runs / "index.json").write_text(json.dumps(index))
    (runs / "commands.jsonl").write_text("")
    text = _write_report(report, runs, tmp_path)
    # seed 0: mean 0.5, sample variance of (0, 0, 1, 1) = 1/3, se = sqrt(1/3 / 4) = 0.2887: +50.0 ± 28.9, 0.5 < 0.577
    # seed 1: mean -0.25, variance of (-1, 0, 0, 0) = 0.25, se = sqrt(0.25 / 4) = 0.25: -25.0 ± 25.0
    assert "| GRPO | +50.0 ± 28.9 | -25.0 ± 25.0 | 0 up, 0 down, of 2 |" in text
    assert report.paired_gain([1] * 10 + [0] * 90) == pytest.approx((0.1, (0.1 * 0.9 * 100 / 99 / 100) ** 0.5))


def test_a_grpo_variant_is_the_baseline_of_the_arms_with_its_suffix(report, tmp_path):
    runs = _check_dir(
        tmp_path,
        "env: sokoban\nmethod_check:\n  seeds: [0, 1]\n  arms:\n    grpo: '--algo grpo'\n"
        "    grpo_lr1e5: '--algo grpo lr=1e-5'\n    seed_self_lr1e5: '--algo seed --analyzer self lr=1e-5'\n"
        "rl: {steps: 2}\neval: {limit: 100, temperature: 0.4, max_steps: 15}\n",
    )
    wins = {("grpo", 0): 20, ("grpo", 1): 30, ("grpo_lr1e5", 0): 30, ("grpo_lr1e5", 1): 32}
    wins |= {("seed_self_lr1e5", 0): 36, ("seed_self_lr1e5", 1): 40}
    index = {f"eval_{a}_s{s}": _eval(runs / "eval" / f"{a}{s}", w, 100) for (a, s), w in wins.items()}
    (runs / "index.json").write_text(json.dumps(index))
    text = _write_report(report, runs, tmp_path)
    # against GRPO: +10, +2 (lr 1e-5) and +16, +10 (SEED at 1e-5); SEED at 1e-5 against GRPO at 1e-5: +6, +8
    assert "| GRPO, lr 1e-5 − GRPO (points) | +10.0 | +2.0 | +6.0 ± 5.7 |" in text
    assert "| SEED, self-analyzer, lr 1e-5 − GRPO (points) | +16.0 | +10.0 | +13.0 ± 4.2 |" in text
    assert "| SEED, self-analyzer, lr 1e-5 − GRPO, lr 1e-5 (points) | +6.0 | +8.0 | +7.0 ± 1.4 |" in text
    # grpo_4x4-style suffixes pair nothing else: no "GRPO, lr 1e-5 − GRPO, lr 1e-5"
    assert "lr 1e-5 − GRPO, lr 1e-5 (points) | +0.0" not in text
