"""Eval summaries, reports, comparisons and plots against hand-computed numbers on hand-built trajectories."""

import json
import math
import sys
from pathlib import Path

import orjson
import pytest

from seedcli.envs import env_class
from seedcli.errors import UserError
from seedcli.records import Trajectory, Turn
from seedcli.report import plots
from seedcli.report.commands import plot_command, report_command, write_eval_outputs
from seedcli.report.compare import compare_runs
from seedcli.report.markdown import render_report
from seedcli.report.plots import (
    plot_compare,
    plot_histogram,
    plot_lines,
    plot_success_by_type,
    plot_training_curves,
    read_metrics,
)
from seedcli.report.results import load_results, per_game, summarize_episodes
from tests.helpers_runs import seal_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALFWORLD = env_class("alfworld")


def turn(step: int, valid: bool = True, tokens: int = 5) -> Turn:
    return Turn(
        step=step,
        observation="obs",
        admissible=["look"],
        prompt="p",
        response="r",
        response_ids=list(range(tokens)),
        action="look",
        valid=valid,
    )


def episode(i: int, task_type: str, won: bool, turns: list[Turn], split: str = "valid_unseen") -> Trajectory:
    return Trajectory(
        episode_id=f"e{i}",
        group_id=f"g{i}",
        game_file=f"json_2.1.1/{split}/{task_type}-{i}/t/game.tw-pddl",
        split=split,
        task_type=task_type,
        task="put a thing somewhere",
        turns=turns,
        won=won,
        reward=10.0 if won else 0.0,
        length=len(turns),
        engine="hf",
        model_id="tiny-qwen",
        model_hash="ab" * 32,
        sampling={"temperature": 0.0, "max_steps": 30},
        prompt_version="v1",
        seed=0,
    )


@pytest.fixture
def episodes() -> list[Trajectory]:
    # pick: 2 of 3 won; look: 0 of 1. Turns: 2+3+1+4 = 10, invalid 1+0+0+2 = 3, tokens 5 per turn except one of 7.
    return [
        episode(0, "pick", True, [turn(1), turn(2, valid=False)]),
        episode(1, "pick", True, [turn(1), turn(2), turn(3, tokens=7)]),
        episode(2, "pick", False, [turn(1)]),
        episode(3, "look", False, [turn(1), turn(2, valid=False), turn(3, valid=False), turn(4)]),
    ]


@pytest.fixture
def results(episodes) -> dict:
    return summarize_episodes(episodes, split="unseen", partial=True, expected_games=134, wall_time_s=75.5)


def test_summary_counts_and_rates_by_hand(results):
    assert results["split"] == "valid_unseen"
    # ALFWorld: score = won, so a category's mean score is its success rate
    two_thirds = pytest.approx(2 / 3, abs=1e-6)
    assert results["categories"]["pick"] == {
        "games": 3,
        "wins": 2,
        "success_rate": two_thirds,
        "mean_score": two_thirds,
    }
    assert results["categories"]["look"] == {"games": 1, "wins": 0, "success_rate": 0.0, "mean_score": 0.0}
    assert results["categories"]["heat"] == {"games": 0, "wins": 0, "success_rate": None, "mean_score": None}
    assert list(results["categories"]) == list(ALFWORLD.categories)
    assert results["env"] == "alfworld" and results["mean_score"] == pytest.approx(0.5)
    # macro over the two types that have games: (2/3 + 0) / 2; micro: 2 wins of 4 games
    assert results["macro_success"] == pytest.approx((2 / 3 + 0) / 2, abs=1e-6)
    assert results["macro_types"] == 2
    assert results["micro_success"] == pytest.approx(0.5)
    assert results["mean_episode_length"] == pytest.approx((2 + 3 + 1 + 4) / 4)
    assert results["invalid_action_rate"] == pytest.approx(3 / 10)
    assert results["tokens_generated"] == 9 * 5 + 7
    assert (results["episodes"], results["expected_games"], results["partial"]) == (4, 134, True)
    assert results["wall_time_s"] == 75.5
    assert results["agent"]["model_id"] == "tiny-qwen" and results["agent"]["policy"] == "model"
    orjson.dumps(results)  # serialisable as results.json


def test_summary_mixed_agents_and_unknown_type(episodes):
    other = episode(9, "slice", True, [turn(1)])
    other.model_id = "other-model"
    res = summarize_episodes(episodes + [other], split="seen", partial=False, expected_games=140, wall_time_s=1.0)
    assert list(res["categories"])[-1] == "slice"
    assert res["agent"]["model_id"] == ["other-model", "tiny-qwen"]
    assert res["macro_success"] == pytest.approx((2 / 3 + 0 + 1) / 3, abs=1e-6)
    assert res["split"] == "valid_seen"


def test_summary_of_no_episodes_has_no_rates():
    res = summarize_episodes([], split="unseen", partial=True, expected_games=134, wall_time_s=0.0)
    assert res["macro_success"] is None and res["micro_success"] is None and res["invalid_action_rate"] is None
    assert "—" in render_report(res, title="t", model_desc="m", run_id="r")


def test_report_marks_partial_and_places_paper_rows(results):
    md = render_report(results, title="Eval", model_desc="tiny-qwen", run_id="run-42")
    assert "Partial result: 4 of 134 games (--limit) — not comparable with the paper" in md
    assert "run-42" in md and "tiny-qwen" in md and "valid_unseen" in md
    assert "| Pick | 3 | 2 | 66.7% |" in md
    assert "| Look | 1 | 0 | 0.0% |" in md
    assert "**33.3%**" in md  # macro
    assert "| Micro average | 4 | 2 | 50.0% |" in md
    assert "Paper (Qwen2.5-3B, docs/design.md §1)" in md
    assert "| SEED (paper) | 86.2% |" in md and "| GRPO (paper) | 70.9% |" in md
    assert "| SDAR (paper)" not in md  # the paper gives SDAR on valid_seen only
    # the baseline rows come from SDAR's paper, which ran ALFWorld with 50 steps (SEED: 30)
    assert "shared with SDAR's paper" in md and "SDAR runs ALFWorld with 50 steps per episode, SEED with 30." in md
    assert "30.0%" in md and "(3 of 10 turns)" in md  # invalid-action rate
    assert "Tokens generated: 52" in md and "1m 16s" in md


def test_full_seen_report_is_not_partial(episodes):
    res = summarize_episodes(episodes, split="valid_seen", partial=False, expected_games=4, wall_time_s=3)
    md = render_report(res, title="Eval", model_desc="m", run_id="r")
    assert "Partial" not in md and "Incomplete" not in md
    assert "| SEED (paper) | 91.8% |" in md and "| Vanilla (paper) | 21.9% |" in md and "| SDAR (paper) | 84.4% |" in md


def test_paper_results_are_the_design_card_macros():
    seen = {m: round(100 * v["macro_success"], 1) for m, v in ALFWORLD.card.paper_results["valid_seen"].items()}
    unseen = {m: round(100 * v["macro_success"], 1) for m, v in ALFWORLD.card.paper_results["valid_unseen"].items()}
    assert seen == {"Vanilla": 21.9, "GRPO": 75.0, "SDAR": 84.4, "SEED": 91.8}
    assert unseen == {"GRPO": 70.9, "SEED": 86.2}


def _png(path) -> bytes:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    return data


def test_success_plot_png_and_partial_title(results, tmp_path, monkeypatch):
    import matplotlib.axes

    titles = []
    set_title = matplotlib.axes.Axes.set_title

    def recording_set_title(self, label, *args, **kwargs):
        titles.append(label)
        return set_title(self, label, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", recording_set_title)
    _png(plot_success_by_type(results, tmp_path / "s.png"))
    assert titles and "PARTIAL: 4 of 134 games" in titles[-1]
    full = dict(results, partial=False, expected_games=4)
    _png(plot_success_by_type(full, tmp_path / "full.png"))
    assert "PARTIAL" not in titles[-1]


def test_report_imports_neither_torch_nor_matplotlib():
    import subprocess

    modules = ", ".join(f"seedcli.report.{m}" for m in ("results", "markdown", "compare", "plots", "commands"))
    code = f"import sys, {modules}; assert 'torch' not in sys.modules; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_compare_table_and_plot(results, episodes, tmp_path):
    full = summarize_episodes(episodes[:2], split="unseen", partial=False, expected_games=2, wall_time_s=1)
    md = compare_runs([("GRPO", full), ("SEED", results)])
    header = md.splitlines()[2]
    assert "GRPO" in header and "SEED (partial)" in header
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in md.splitlines()
        if line.startswith("| ") and not line.startswith("| |")
    }
    assert rows["Pick"] == ["100.0% (2/2)", "66.7% (2/3)"]
    assert rows["Look"] == ["—", "0.0% (0/1)"]
    assert rows["**Macro**"] == ["**100.0%**", "**33.3%**"]
    assert rows["Micro"] == ["100.0%", "50.0%"]
    assert rows["Mean length"] == ["2.5", "2.5"]
    assert "SEED: Partial result" in md
    _png(plot_compare([("GRPO", full), ("SEED", results)], tmp_path / "c.png"))


def test_compare_shows_a_dash_for_a_category_a_run_never_played(results, episodes):
    full = summarize_episodes(episodes[:2], split="unseen", partial=False, expected_games=2, wall_time_s=1)
    full["categories"] = {k: v for k, v in full["categories"].items() if k == "pick_and_place_simple"}
    md = compare_runs([("a", full), ("b", results)])
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "| — |" in rows["Look"] and "0.0% (0/1)" in rows["Look"]


def test_compare_warns_on_different_splits(results, episodes):
    seen = summarize_episodes(episodes, split="seen", partial=False, expected_games=4, wall_time_s=1)
    assert "different splits" in compare_runs([("a", seen), ("b", results)])


def _write_metrics(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_training_curves_two_runs(tmp_path):
    grpo = _write_metrics(
        tmp_path / "grpo.jsonl",
        [
            {
                "step": s,
                "reward/mean": 1.0 * s,
                "rollout/success_rate": 0.1 * s,
                "env/episode_length": 30 - s,
                "actor/kl": 0.001 * s,
                "actor/kl_max": 0.2 * s,
                "opd/loss": float("nan"),
            }
            for s in range(1, 6)
        ]
        + [{"step": 5, "val/success_rate": 0.4}],
    )
    seed = _write_metrics(
        tmp_path / "seed.jsonl",
        [
            {
                "step": s,
                "reward/mean": 2.0 * s,
                "env/success_rate": 0.15 * s,
                "opd/loss": -0.5,
                "opd/gate_mean": 0.6,
                "opd/teacher_gap_absmax": 0.05 * s,
                "actor/kl": None,
            }
            for s in range(1, 6)
        ],
    )
    out = tmp_path / "plots"
    paths = plot_training_curves([("GRPO", grpo), ("SEED", seed)], out)
    names = [p.name for p in paths]
    assert names == [
        "reward.png",
        "success_rate.png",
        "episode_length.png",
        "opd_loss.png",
        "gate_mean.png",
        "kl.png",
        "kl_max.png",
        "teacher_gap_max.png",
        "curves.png",
    ]
    for p in paths:
        _png(p)
    # data behind the plots: NaN / None dropped, aliases resolved per run, val as its own series
    runs = [("GRPO", read_metrics(grpo)), ("SEED", read_metrics(seed))]
    fam = {stem: lines for stem, _, _, lines in plots._curve_data(runs)}
    assert [(r, s, k) for r, s, k, _, _ in fam["success_rate"]] == [
        ("GRPO", "train", "rollout/success_rate"),
        ("GRPO", "val", "val/success_rate"),
        ("SEED", "train", "env/success_rate"),
    ]
    assert [r for r, *_ in fam["opd_loss"]] == ["SEED"]  # GRPO's all-NaN opd/loss draws nothing
    assert [r for r, *_ in fam["kl"]] == ["GRPO"]
    assert fam["kl_max"][0][3:] == ([1.0, 2.0, 3.0, 4.0, 5.0], [0.2, 0.4, 0.6000000000000001, 0.8, 1.0])
    assert fam["reward"][1][3:] == ([1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0, 8.0, 10.0])


def test_training_curves_skip_absent_metrics(tmp_path):
    m = _write_metrics(tmp_path / "m.jsonl", [{"step": 1, "reward/mean": 0.5}, {"reward/mean": 0.7}])
    paths = plot_training_curves([("run", m)], tmp_path / "o")
    assert [p.name for p in paths] == ["reward.png", "curves.png"]
    assert not (tmp_path / "o" / "kl.png").exists()
    # a record without a step is placed by its position
    assert plots._series(read_metrics(m), "reward/mean") == ([1.0, 2.0], [0.5, 0.7])


def test_metrics_half_written_last_line_is_ignored(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text('{"step": 1, "reward/mean": 1}\n{"step": 2, "rew')
    assert len(read_metrics(m)) == 1


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty"),
        ("\n\n", "empty"),
        ('{"step": 1}\nnot json\n{"step": 3}\n', "m.jsonl:2: not a JSON line"),
        ("[1, 2]\n", "m.jsonl:1: a JSON list"),
    ],
)
def test_bad_metrics_files(tmp_path, content, message):
    m = tmp_path / "m.jsonl"
    m.write_text(content)
    with pytest.raises(UserError, match=message) as exc:
        plot_training_curves([("r", m)], tmp_path / "o")
    assert "\n" not in str(exc.value)


def test_metrics_without_known_keys(tmp_path):
    m = _write_metrics(tmp_path / "m.jsonl", [{"step": 1, "perf/throughput": 3.0}])
    with pytest.raises(UserError, match="none of the plotted metrics"):
        plot_training_curves([("r", m)], tmp_path / "o")


def test_report_command(results, tmp_path):
    run = tmp_path / "runs" / "eval" / "20250101T000000Z-abcdef12"
    written = write_eval_outputs(run, results, run_id=run.name)
    assert {p.name for p in written.values()} == {"results.json", "report.md", "success_by_type.png"}
    seal_run(run, "eval")
    assert load_results(run) == orjson.loads(orjson.dumps(results))
    out = report_command([run], tmp_path / "rep")
    assert set(out) == {"compare_md", "compare_png", "report_md", "success_png"}
    assert "Partial result" in out["report_md"].read_text()
    _png(out["compare_png"])
    # another run of the same name (another runs tree), given as its results.json
    other = tmp_path / "elsewhere" / "eval" / run.name
    write_eval_outputs(other, results, run_id=other.name)
    seal_run(other, "eval", {"seed": 1})
    out2 = report_command([run, other / "results.json"], tmp_path / "rep2")
    assert set(out2) == {"compare_md", "compare_png"}
    header = out2["compare_md"].read_text().splitlines()[2]
    assert "abcdef12 (partial)" in header and "abcdef12 #2 (partial)" in header


def test_report_command_bad_inputs(tmp_path):
    not_eval = tmp_path / "runs" / "rl" / "x"
    not_eval.mkdir(parents=True)
    with pytest.raises(UserError, match="no results.json, so not an eval run"):
        report_command([not_eval], tmp_path / "o")
    with pytest.raises(UserError, match="no such file or directory"):
        report_command([tmp_path / "missing"], tmp_path / "o")
    (not_eval / "results.json").write_text("{oops")
    with pytest.raises(UserError, match="not valid JSON"):
        load_results(not_eval)
    (not_eval / "results.json").write_text('{"split": "valid_seen"}')
    with pytest.raises(UserError, match="missing categories, macro_success"):
        load_results(not_eval)
    assert not (tmp_path / "o" / "compare.md").exists()


def test_plot_command(tmp_path):
    run = tmp_path / "runs" / "rl" / "r1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"config": {"algo": "grpo"}}))
    _write_metrics(run / "metrics.jsonl", [{"step": s, "reward/mean": s, "actor/kl": math.sqrt(s)} for s in (1, 2)])
    paths = plot_command([run], tmp_path / "plots")
    assert [p.name for p in paths] == ["reward.png", "kl.png", "curves.png"]
    with pytest.raises(UserError, match="no metrics.jsonl"):
        plot_command([tmp_path], tmp_path / "plots")


def _webshop_episode(i: int, category: str, score: float) -> Trajectory:
    return Trajectory(
        episode_id=f"w{i}", group_id=f"w{i}", env="webshop", task_id=f"goal-{i}", split="test", category=category,
        task="i need a red shirt", turns=[turn(1)], won=score == 1.0, score=score,
        reward=10.0 if score == 1.0 else 0.0, length=1, engine="hf", model_id="m", model_hash="h",
        sampling={}, prompt_version="webshop-v1", seed=0,
    )  # fmt: skip


def test_webshop_results_report_score_success_and_the_paper(tmp_path):
    # fashion: scores 1.0 and 0.5 (1 success); grocery: 0.25 (0 successes). By hand:
    # mean score (all goals) = 1.75 / 3; success = 1 / 3; macro score = (0.75 + 0.25) / 2 = 0.5
    eps = [
        _webshop_episode(0, "fashion", 1.0),
        _webshop_episode(1, "fashion", 0.5),
        _webshop_episode(2, "grocery", 0.25),
    ]
    res = summarize_episodes(eps, split="test", partial=True, expected_games=500, wall_time_s=1.0)
    assert res["env"] == "webshop" and res["split"] == "test"
    assert res["mean_score"] == pytest.approx(1.75 / 3, abs=1e-6) and res["micro_success"] == pytest.approx(1 / 3)
    assert res["macro_score"] == pytest.approx(0.5) and res["categories"]["fashion"]["mean_score"] == 0.75
    md = render_report(res, title="WebShop test", model_desc="m", run_id="r")
    assert "## Score and success by product category" in md
    assert "| Product category | Goals | Wins | Success | Score |" in md
    assert "| Fashion | 2 | 1 | 50.0% | 75.0 |" in md
    # the headline in bold is WebShop's: the score over all goals, not the macro success
    assert "| Macro average | | | 25.0% | 50.0 |" in md
    assert "| **Micro average** | 3 | 1 | 33.3% | **58.3** |" in md
    assert "| **This run** (partial) | **58.3** | **33.3%** |" in md  # score first (the headline), then success
    assert "| SEED (paper) | 88.5 | 78.9% |" in md
    assert "ALFWorld" not in md
    write_eval_outputs(tmp_path, res, run_id="r")
    assert (tmp_path / "success_by_type.png").read_bytes()[:8] == PNG_MAGIC
    assert load_results(tmp_path)["env"] == "webshop"


def test_schema1_results_still_load_and_report(tmp_path, results):
    old = {k: v for k, v in results.items() if k not in ("env", "categories", "mean_score", "macro_score")}
    old["task_types"] = {
        t: {k: v for k, v in row.items() if k != "mean_score"} for t, row in results["categories"].items()
    }
    old["schema_version"] = 1
    (tmp_path / "results.json").write_text(json.dumps(old))
    loaded = load_results(tmp_path)
    assert loaded["env"] == "alfworld" and list(loaded["categories"]) == list(ALFWORLD.categories)
    assert "| Pick | 3 | 2 | 66.7% |" in render_report(loaded, title="t", model_desc="m", run_id="r")


def test_score_curve_is_drawn_when_a_run_logs_it(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "reward/mean": 1.0, "reward/score_mean": 0.1 * s, "val/score": 0.05 * s} for s in (1, 2, 3)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = plot_training_curves([("SEED", metrics)], tmp_path / "o")
    assert [p.name for p in paths] == ["reward.png", "score.png", "curves.png"]
    _png(tmp_path / "o" / "score.png")


def _search_episode(i: int, source: str, em: bool) -> Trajectory:
    return Trajectory(
        episode_id=f"s{i}", group_id=f"s{i}", env="search", task_id=f"{source}-{i}", split="test", category=source,
        task="who wrote it?", turns=[turn(1)], won=em, score=1.0 if em else 0.0, reward=1.0 if em else 0.0,
        length=1, engine="none", model_id="expert", model_hash="", sampling={}, prompt_version="search-v1", seed=0,
        policy="expert",
    )  # fmt: skip


def _search_results(wins: dict[str, int], n: int = 2) -> dict:
    eps = [_search_episode(i * 10 + j, src, j < w) for i, (src, w) in enumerate(wins.items()) for j in range(n)]
    return summarize_episodes(eps, split="test", partial=True, expected_games=100, wall_time_s=1.0)


def test_search_compare_hides_sources_without_data_and_names_its_measure(tmp_path, monkeypatch):
    a = _search_results({"nq": 1, "hotpotqa": 2})
    b = _search_results({"nq": 0, "hotpotqa": 1})
    md = compare_runs([("expert policy", a), ("random policy", b)])
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "NQ" in rows and "HotpotQA" in rows
    assert not {"TriviaQA", "PopQA", "2Wiki", "MuSiQue", "Bamboogle", "HotpotQA (closed)"} & set(rows)
    assert "| NQ | 50.0 (1/2) | 0.0 (0/2) |" in md
    assert "| **Exact match (average over data sources)** | **75.0** | **25.0** |" in md
    assert "| Exact match (all questions) | 75.0 | 25.0 |" in md
    assert "**Macro**" not in md

    drawn = _capture_axes(monkeypatch)
    _png(plot_compare([("expert policy", a), ("random policy", b)], tmp_path / "c.png"))
    ax = drawn["ax"]
    assert ax.get_ylabel() == "exact match"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["NQ", "HotpotQA", "Average"]
    assert ax.get_title().startswith("Search-QA: exact match by data source")
    # ten sources with long names are slanted instead of running together
    many = {src: 1 for src in ("nq", "hotpotqa", "2wiki", "musique", "bamboogle", "hotpotqa_train", "musique_train")}
    plot_compare([("x", _search_results(many))], tmp_path / "m.png")
    assert all(t.get_rotation() == 30 for t in drawn["ax"].get_xticklabels())


def test_webshop_score_marks_do_not_cover_the_count_labels(tmp_path, monkeypatch):
    eps = [
        _webshop_episode(0, "fashion", 1.0),
        _webshop_episode(1, "fashion", 1.0),
        _webshop_episode(2, "grocery", 0.5),
    ]
    res = summarize_episodes(eps, split="test", partial=False, expected_games=3, wall_time_s=1.0)
    drawn = _capture_axes(monkeypatch)
    _png(plot_success_by_type(res, tmp_path / "w.png"))
    ax = drawn["ax"]
    marks = ax.lines[0].get_ydata()  # mean score per category, then the macro score
    labels = {a.get_text(): a for a in ax.texts}
    assert set(labels) == {"2/2", "0/1", "50.0%"}
    for name, mark in zip(("2/2", "0/1", "50.0%"), marks, strict=True):
        label = labels[name]
        # each label sits at or above its category's score mark, lifted clear of the diamond
        assert label.xy[1] >= mark - 1e-9 and label.xyann[1] >= 7
    assert ax.get_legend() is not None and ax.get_legend().get_bbox_to_anchor() is not None
    assert ax.get_ylim()[1] >= 1.15


def test_a_search_url_report_names_its_retriever(tmp_path):
    res = _search_results({"nq": 1})
    res["setup"] = {"data_root": None, "env_options": {"search_url": "http://10.0.0.5:8000/retrieve", "topk": 3}}
    md = render_report(res, title="t", model_desc="m", run_id="r")
    assert "- Retriever: http://10.0.0.5:8000/retrieve (`env_options.search_url`" in md
    assert "- Environment options: topk=3" in md
    assert "Offline corpus" not in md  # the offline note speaks of the bundled corpus, which this run did not use
    res["setup"] = {"data_root": "/data/search", "env_options": {}}
    md = render_report(res, title="t", model_desc="m", run_id="r")
    assert "- Retriever: in-process BM25 over /data/search/corpus.jsonl" in md and "Offline corpus" in md


def test_report_labels_runs_by_policy_and_model(tmp_path):
    def eval_run(name: str, config: dict, inputs: list, results: dict):
        run = tmp_path / "eval" / name
        write_eval_outputs(run, results, run_id=name)
        seal_run(run, "eval", config, inputs)
        return run

    rl = tmp_path / "rl" / "r1"
    seal_run(rl, "rl", {"algo": "seed"})
    res = _search_results({"nq": 1})
    runs = [
        eval_run("e1", {"policy": "expert"}, [], res),
        eval_run("e2", {"policy": "model", "from_run": str(rl)}, [rl], res),
        eval_run("e3", {"policy": "model", "from_run": f"{rl}/checkpoints/step_000040"}, [rl], res),
        eval_run("e4", {"policy": "model", "model": "/models/qwen-3b"}, [], res),
        eval_run("e5", {"policy": "expert"}, [], res),
    ]
    out = report_command(runs, tmp_path / "rep")
    header = out["compare_md"].read_text().splitlines()[2]
    for label in ("expert policy · e1", "SEED rl (partial)", "SEED rl step_000040", "qwen-3b", "expert policy · e5"):
        assert label in header


def test_method_check_plots_draw_through_report_plots(tmp_path):
    hist = plot_histogram([-1.0, 0.5, 0.25], tmp_path / "h.png", title="t", xlabel="x", ylabel="y", log=True)
    lines = plot_lines(
        [([1, 2, 3], [3.0, 2.0, 1.0], "nll", None), ([1, 2, 3], [4.0, 3.0, 2.0], "loss", 0.6)],
        tmp_path / "l.png",
        title="t",
        xlabel="batch",
        ylabel="nats",
    )
    _png(hist), _png(lines)
    script = (Path(__file__).resolve().parents[2] / "scripts" / "method_check_report.py").read_text()
    assert "_new_figure" not in script and "_save_png" not in script and "import matplotlib" not in script


def _capture_axes(monkeypatch) -> dict:
    """Keep the axes of the last figure `plots` saves (drawn["ax"]), so a test can read what was drawn."""
    drawn = {}
    save = plots._save_png

    def keep(fig, path):
        drawn["ax"] = fig.axes[0]
        return save(fig, path)

    monkeypatch.setattr(plots, "_save_png", keep)
    return drawn


def _eval_run(root, name, wins: list[bool], split="valid_unseen", episodes_file=True, config=None, inputs=()):
    """An eval run directory as `seed eval` leaves it: results.json and, unless told not to, episodes.jsonl, sealed
    by a complete manifest (`config`: the eval's settings beyond EvalConfig's defaults; `inputs`: runs it read)."""
    from seedcli.records import write_jsonl

    eps = [episode(i, "pick", won, [turn(1)], split=split) for i, won in enumerate(wins)]
    run = root / name
    write_eval_outputs(
        run, summarize_episodes(eps, split=split, partial=True, expected_games=134, wall_time_s=1), run_id=name
    )
    if episodes_file:
        write_jsonl(run / "episodes.jsonl", eps)
    seal_run(run, "eval", config, inputs)
    return run


def test_report_gives_each_runs_paired_gain_over_the_first(tmp_path):
    # 10 games: the first run solves 0-3, the second 2-7 (4 gained, 2 lost), the third has no episodes file
    first = _eval_run(tmp_path, "a", [i < 4 for i in range(10)])
    second = _eval_run(tmp_path, "b", [2 <= i < 8 for i in range(10)])
    third = _eval_run(tmp_path, "c", [True] * 10, episodes_file=False)
    md = report_command([first, second, third], tmp_path / "rep")["compare_md"].read_text()
    row = next(line for line in md.splitlines() if line.startswith("| Gain over"))
    # d = (0,0,+1... ): games 0,1 -1; 4..7 +1; others 0 -> mean 0.2, sample variance (6 - 10*0.04)/9
    se = math.sqrt((6 - 10 * 0.2**2) / 9 / 10)
    assert row.split("|")[2:-1] == [" reference ", f" +20.0 ± {100 * se:.1f} (4 up, 2 down, of 10) ", " — "]
    assert "sd(d)/√n" in md
    # beyond 2 SE is marked
    up = _eval_run(tmp_path, "d", [True] * 10)
    row = next(
        line
        for line in report_command([first, up], tmp_path / "rep2")["compare_md"].read_text().splitlines()
        if line.startswith("| Gain over")
    )
    assert "+60.0 ± 16.3 ↑ (6 up, 0 down, of 10)" in row
    # no row without the first run's games, nor across splits
    md = report_command([third, second], tmp_path / "rep3")["compare_md"].read_text()
    assert "Gain over" not in md
    seen = _eval_run(tmp_path, "e", [True] * 10, split="valid_seen")
    md = report_command([first, seen], tmp_path / "rep4", allow_mismatch=True)["compare_md"].read_text()
    assert "Gain over" not in md
    # a tampered episodes file is one line naming it: refused against the manifest, or, read alone, by its content
    (second / "episodes.jsonl").write_text('{"task_id": "x"}\n')
    with pytest.raises(UserError, match=r"episodes.jsonl does not match its sha256 in the manifest"):
        report_command([first, second], tmp_path / "rep5")
    with pytest.raises(UserError, match=r"episodes.jsonl: episode 1 has no task_id or won; rerun `seed eval`"):
        per_game(second, "won")
    (second / "episodes.jsonl").write_text('{"task_id": "x", "won": tr')
    with pytest.raises(UserError, match=r"episodes.jsonl:1: not a valid JSON record"):
        per_game(second, "won")


def test_report_seeds_groups_runs_into_recipes_with_the_seed_spread_in_the_error(tmp_path):
    # start: 2 of 10 games; recipe A's three seeds win 5, 6 and 7 of them, recipe B's win 2, 3 and 1
    start = _eval_run(tmp_path, "s", [i < 2 for i in range(10)])
    a = [_eval_run(tmp_path, f"a{k}", [i < w for i in range(10)]) for k, w in enumerate((5, 6, 7))]
    b = [_eval_run(tmp_path, f"b{k}", [i < w for i in range(10)]) for k, w in enumerate((2, 3, 1))]
    md = report_command([start, *a, *b], tmp_path / "rep", seeds=3)["compare_md"].read_text()
    rows = [line.split("|")[1:-1] for line in md.splitlines() if line.startswith(("| 2–4", "| 5–7"))]
    # A: mean 0.6, std 0.1; SE = sqrt(0.1²/3 + 0.2·0.8/10) = 0.1390; gain 40 / 13.9 = 2.88
    se_a = math.sqrt(0.01 / 3 + 0.16 / 10)
    assert [c.strip() for c in rows[0][1:]] == [
        "3",
        "50.0% 60.0% 70.0%",
        "60.0% ± 10.0",
        "+40.0",
        f"{100 * se_a:.1f}",
        f"{0.4 / se_a:+.2f}",
        "2 up, 0 down, of 3",
    ]
    # B: mean 0.2, gain 0; its runs' paired gains: 0, +10 (1 up of 10: within 2 SE), -10
    se_b = math.sqrt(0.01 / 3 + 0.16 / 10)
    assert [c.strip() for c in rows[1][3:]] == [
        "20.0% ± 10.0",
        "+0.0",
        f"{100 * se_b:.1f}",
        "+0.00",
        "0 up, 0 down, of 3",
    ]
    assert "s/√k" in md
    # the method check computes its gain with the same function
    from seedcli.report.results import seeds_gain

    assert seeds_gain([0.5, 0.6, 0.7], 0.2, 10, 10) == pytest.approx((0.6, 0.4, se_a))
    assert seeds_gain([0.5], 0.2, 10, 10)[2] == pytest.approx(math.sqrt(0.25 / 10 + 0.16 / 10))
    # runs that do not make whole groups: one line saying what to pass
    with pytest.raises(UserError, match=r"--seeds 3: 5 run\(s\) after the first do not make groups of 3"):
        report_command([start, *a, *b[:2]], tmp_path / "rep2", seeds=3)
    assert not (tmp_path / "rep2").exists()


def test_report_seeds_names_each_recipe_by_the_settings_that_tell_the_recipes_apart(tmp_path):

    from seedcli.report.commands import recipe_names

    def from_rl(name, wins, **config):
        rl = tmp_path / f"rl-{name}"
        seal_run(rl, "rl", config)
        return _eval_run(tmp_path, name, wins, inputs=[rl])

    start = _eval_run(tmp_path, "s", [i < 2 for i in range(10)])
    # two recipes of one algorithm: the lr tells them apart; seed and runs_dir differ within a recipe by design,
    # kl_coef is the same everywhere
    runs = [
        from_rl(f"{lr}-{k}", [i < 3 + k for i in range(10)], algo="grpo", lr=lr, kl_coef=0.01, seed=k, runs_dir=f"r{k}")
        for lr in (3e-5, 1e-5)
        for k in range(2)
    ]
    md = report_command([start, *runs], tmp_path / "rep", seeds=2)["compare_md"].read_text()
    assert [line.split("|")[1].strip() for line in md.splitlines() if line.startswith(("| 2–3", "| 4–5"))] == [
        "2–3 (GRPO rl; lr=3e-05)",
        "4–5 (GRPO rl; lr=1e-05)",
    ]
    # a setting that varies inside a recipe does not name it; nothing to tell apart, or a run without a training
    # config: no names
    cfg = [{"lr": 1, "kl_coef": 0.1}, {"lr": 1, "kl_coef": 0.2}, {"lr": 2, "kl_coef": 0.1}, {"lr": 2, "kl_coef": 0.1}]
    assert recipe_names(cfg, 2) == ["lr=1", "lr=2"]
    assert recipe_names([{"lr": 1}] * 4, 2) is None
    assert recipe_names([{"lr": 1}, None, {"lr": 2}, {"lr": 2}], 2) is None
    assert (
        "| 2–3 (tiny-qwen) |"
        in report_command(
            [start, *[_eval_run(tmp_path, f"m{k}", [True] * 10) for k in range(4)]], tmp_path / "rep2", seeds=2
        )["compare_md"].read_text()
    )


def test_report_seeds_on_the_command_line_exits_2_on_a_bad_grouping(tmp_path):
    from typer.testing import CliRunner

    from seedcli.cli import app

    start = _eval_run(tmp_path, "s", [True, False])
    runs = [str(_eval_run(tmp_path, f"r{k}", [True, True])) for k in range(2)]
    bad = CliRunner().invoke(app, ["report", str(start), *runs, "--seeds", "3", "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2 and "do not make groups of 3" in bad.output
    ok = CliRunner().invoke(app, ["report", str(start), *runs, "--seeds", "2", "--out", str(tmp_path / "o")])
    assert ok.exit_code == 0, ok.output
    assert "Recipes over seeds" in (tmp_path / "o" / "compare.md").read_text()
