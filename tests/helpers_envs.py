"""Every stage of the pipeline on one environment, in process with a tiny model: what the environment tests share
(tests/integration/test_env_adapters.py, test_env_plugins.py)."""

from __future__ import annotations

import json
from pathlib import Path

from seedcli.config import AnnotateConfig, CollectConfig, EvalConfig, RLConfig, SFTConfig
from seedcli.records import Trajectory, read_jsonl
from seedcli.stages import annotate, collect, rl, sft
from seedcli.stages import eval as eval_stage


def every_stage(runs: Path, model: Path, env: str, options: dict, workers: int = 0) -> dict[str, Path]:
    """collect → annotate (rules) → sft → rl (the rules skills as a static library: the teacher pass) → eval, the
    smallest settings; the run directories by stage."""
    common = {"env": env, "env_options": options, "runs_dir": str(runs), "workers": workers}
    out = {}
    m = collect.run(CollectConfig(**common, model=str(model), tasks=2, rollouts=2, max_steps=2, max_new_tokens=12))
    out["collect"] = runs / "collect" / m.run_id
    out["annotate"] = runs / "annotate" / annotate.run(AnnotateConfig(analyzer="rules", runs_dir=str(runs))).run_id
    out["sft"] = runs / "sft" / sft.run(SFTConfig(runs_dir=str(runs), epochs=1, max_length=2048)).run_id
    cfg = RLConfig(**common, steps=1, batch_tasks=2, group=2, max_steps=2, max_new_tokens=8,
                   analyzer=f"static:{out['annotate']}")  # fmt: skip
    out["rl"] = runs / "rl" / rl.run(cfg).run_id
    ev = eval_stage.run(EvalConfig(**common, from_run=str(out["rl"]), limit=2, max_new_tokens=8))
    out["eval"] = runs / "eval" / ev.run_id
    return out


def check_runs(out: dict[str, Path], env: str, categories: set[str]) -> list:
    """What every adapter's pipeline must show; the collected trajectories."""
    trajectories = [Trajectory.model_validate(r) for r in read_jsonl(out["collect"] / "trajectories.jsonl")]
    assert len(trajectories) == 4 and {t.env for t in trajectories} == {env}
    assert {t.category for t in trajectories} <= categories
    skills = [json.loads(x) for x in (out["annotate"] / "skills.jsonl").read_text().splitlines()]
    assert len(skills) == 4 and all(s["episode_skill"] for s in skills)
    assert (out["sft"] / "model" / "config.json").is_file()
    (record,) = [json.loads(x) for x in (out["rl"] / "metrics.jsonl").read_text().splitlines()]
    assert record["rollout/episodes"] == 4 and record["opd/token_frac"] > 0
    results = json.loads((out["eval"] / "results.json").read_text())
    assert results["env"] == env and results["episodes"] == 2
    return trajectories
