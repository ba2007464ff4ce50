"""`seed sft` on a tiny model and a tiny pipeline (synthetic collect run → real `rules` annotate run), CPU only.

One CLI run with the tiny preset is shared by most tests; LoRA, resume and bad-input tests make their own runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seedcli.analyzers import analysis_messages
from seedcli.artifacts import open_run, read_manifest, verify_run
from seedcli.config import AnnotateConfig, CollectConfig, SFTConfig, build_config
from seedcli.envs.alfworld.projection import format_response
from seedcli.errors import UserError
from seedcli.records import SkillRecord, Trajectory, Turn, iter_jsonl, read_jsonl, write_jsonl
from seedcli.sftdata import IGNORE_INDEX, Example, completion_text

REPO = Path(__file__).resolve().parents[2]

# (task, object, receptacle, kind) — a few task shapes so the skills differ
TASKS = [
    ("put a clean apple in fridge.", "apple", "fridge", "clean"),
    ("put a hot mug in coffeemachine.", "mug", "coffeemachine", "heat"),
    ("put a cool potato in countertop.", "potato", "countertop", "cool"),
    ("put some egg on diningtable.", "egg", "diningtable", "pick"),
    ("put a clean knife in drawer.", "knife", "drawer", "clean"),
]
TOOL = {"clean": "sinkbasin 1", "heat": "microwave 1", "cool": "fridge 1"}


def _actions(obj: str, recep: str, kind: str, won: bool) -> list[tuple[str, str]]:
    """(observation, action) pairs of an episode; a failed one wanders and bumps into "Nothing happens."."""
    if not won:
        return [
            ("You arrive at cabinet 1. The cabinet 1 is closed.", "go to cabinet 1"),
            ("Nothing happens.", f"take {obj} 1 from cabinet 1"),
            ("Nothing happens.", f"take {obj} 1 from cabinet 1"),
            ("You arrive at shelf 1. On the shelf 1, you see nothing.", "go to shelf 1"),
        ]
    steps = [
        (f"You arrive at countertop 1. On the countertop 1, you see a {obj} 1 and a spoon 2.", "go to countertop 1"),
        (f"You pick up the {obj} 1 from the countertop 1.", f"take {obj} 1 from countertop 1"),
    ]
    if kind in TOOL:
        steps += [
            (f"You arrive at {TOOL[kind]}.", f"go to {TOOL[kind]}"),
            (f"You {kind} the {obj} 1 using the {TOOL[kind]}.", f"{kind} {obj} 1 with {TOOL[kind]}"),
        ]
    steps += [
        (f"You arrive at {recep} 1.", f"go to {recep} 1"),
        (f"You move the {obj} 1 to the {recep} 1.", f"move {obj} 1 to {recep} 1"),
    ]
    return steps


def make_trajectories(n_tasks: int = 10, rollouts: int = 2) -> list[Trajectory]:
    out = []
    for g in range(n_tasks):
        task, obj, recep, kind = TASKS[g % len(TASKS)]
        for r in range(rollouts):
            won = (g + r) % 2 == 0
            pairs = _actions(obj, recep, kind, won)
            turns = [
                Turn(
                    step=i + 1,
                    observation=obs if i == 0 else pairs[i - 1][0],
                    admissible=[action, "look", "inventory"],
                    prompt="(agent prompt)",
                    response=format_response(f"I should {action} now.", action),
                    action=action,
                    valid=True,
                    admissible_action=True,
                )
                for i, (obs, action) in enumerate(pairs)
            ]
            out.append(
                Trajectory(
                    episode_id=f"g{g:04d}-r{r:02d}",
                    group_id=f"g{g:04d}",
                    game_file=f"train/{kind}/{g}/game.tw-pddl",
                    split="train",
                    task_type=kind,
                    task=task,
                    turns=turns,
                    won=won,
                    reward=10.0 if won else 0.0,
                    length=len(turns),
                    engine="hf",
                    model_id="tiny",
                    model_hash="0" * 64,
                    sampling={"temperature": 1.0},
                    prompt_version="alfworld-agent-v1",
                    seed=0,
                )
            )
    return out


def make_collect_run(runs_dir: Path, model: Path, trajectories: list[Trajectory]) -> Path:
    cfg = CollectConfig(runs_dir=str(runs_dir), model=str(model), tasks=len(trajectories), rollouts=1)
    with open_run("collect", cfg, argv=["test"]) as run:
        n = write_jsonl(run.file("trajectories.jsonl"), trajectories)
        run.complete({"trajectories.jsonl": n}, {"episodes": n})
    return run.path


def make_annotate_run(runs_dir: Path, collect_dir: Path, records: list[SkillRecord]) -> Path:
    """A hand-made annotate run (for inputs the real analyzers would not produce)."""
    cfg = AnnotateConfig(runs_dir=str(runs_dir), analyzer="rules", from_run=str(collect_dir))
    with open_run("annotate", cfg, argv=["test"]) as run:
        run.add_input("collect", collect_dir)
        n = write_jsonl(run.file("skills.jsonl"), records)
        write_jsonl(run.file("rejected.jsonl"), [])
        run.complete({"skills.jsonl": n, "rejected.jsonl": 0})
    return run.path


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, tiny_model) -> dict:
    """runs/ with a synthetic collect run and the real `rules` annotate run of it."""
    from seedcli.stages import annotate

    runs = tmp_path_factory.mktemp("runs")
    collect_dir = make_collect_run(runs, tiny_model, make_trajectories())
    manifest = annotate.run(AnnotateConfig(runs_dir=str(runs), analyzer="rules", from_run=str(collect_dir)))
    annotate_dir = runs / "annotate" / manifest.run_id
    return {"runs": runs, "collect": collect_dir, "annotate": annotate_dir, "model": tiny_model}


def _cli(*args: str, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "seedcli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def tiny_sft(pipeline) -> dict:
    """`seed sft -c tiny` as the demo runs it (base model from the collect run), plus a higher lr so that the loss
    visibly moves in one epoch of a random model."""
    t0 = time.time()
    proc = _cli("sft", "-c", "tiny", "--runs-dir", str(pipeline["runs"]), "--lr", "1e-3", "--save-steps", "4", "--json")
    wall = time.time() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    run_dir = pipeline["runs"] / "sft" / summary["run_id"]
    print(f"\ntiny sft CLI run: {wall:.1f}s wall, metrics {json.dumps(summary['metrics'], default=str)[:1500]}")
    return {"dir": run_dir, "summary": summary, "stderr": proc.stderr, "wall": wall}


# --------------------------------------------------------------------------------------------------- the main run


def test_manifest_chains_to_annotate_and_records_base_model(tiny_sft, pipeline):
    from seedcli.engines.tiny import model_hash

    m = verify_run(tiny_sft["dir"], "sft")  # complete, every output file matches its hash
    assert {(i.stage, i.run_id) for i in m.inputs} == {
        ("annotate", pipeline["annotate"].name),
        ("collect", pipeline["collect"].name),
    }
    assert m.metrics["base_model"] == str(pipeline["model"])
    assert m.metrics["base_model_hash"] == model_hash(pipeline["model"])
    kept = sum(1 for _ in iter_jsonl(pipeline["annotate"] / "skills.jsonl"))
    assert m.metrics["data/skills"] == kept > 0
    assert m.metrics["data/train_examples"] + m.metrics["data/val_examples"] == kept
    assert m.metrics["data/val_examples"] == round(kept * 0.2)  # tiny preset: val_fraction 0.2
    assert m.config["epochs"] == 1 and m.config["lr"] == 1e-3 and m.config["max_length"] == 2048
    assert m.metrics["model_hash"] == model_hash(tiny_sft["dir"] / "model")
    assert {"model/config.json", "metrics.jsonl", "data/train.jsonl"} <= {o.path for o in m.outputs}
    assert not any(o.path.startswith("checkpoints/") for o in m.outputs)
    assert (tiny_sft["dir"] / "checkpoints").is_dir()


def test_validation_loss_drops(tiny_sft):
    m = read_manifest(tiny_sft["dir"])
    before, after = m.metrics["val/loss_before"], m.metrics["val/loss_after"]
    print(f"\nval/loss before {before:.4f} after {after:.4f}")
    assert after < before - 0.05
    rows = read_jsonl(tiny_sft["dir"] / "metrics.jsonl")
    val_steps = [r["step"] for r in rows if "val/loss" in r]
    assert val_steps[0] == 0 and val_steps[-1] == m.metrics["train/steps"] > 0
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, m.metrics["train/steps"] + 1))
    assert all(r["train/lr"] is not None for r in train_rows)
    assert any(r.get("perf/tokens_per_s", 0) > 0 for r in train_rows)


def test_exported_model_loads_with_transformers_and_the_policy_analyzer(tiny_sft, pipeline):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tiny_sft["dir"] / "model"
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.chat_template  # later stages render prompts with it
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(pipeline["model"])
    ids = torch.tensor([tok("Your task is to: put a clean apple in fridge.")["input_ids"]])
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, base(ids).logits)  # trained, not a copy of the base

    from seedcli.analyzers.policy import analyze_with_engine
    from seedcli.engines import load_engine

    engine = load_engine("hf", model_dir, device="cpu")
    try:
        # the engine renders the analysis prompt to exactly the ids the model was trained on
        ex = Example.from_json(next(iter_jsonl(tiny_sft["dir"] / "data" / "train.jsonl")))
        prompt = tok.decode(ex.input_ids[: ex.prompt_len])
        rec = next(
            r for r in iter_jsonl(pipeline["annotate"] / "skills.jsonl", SkillRecord) if r.episode_id == ex.episode_id
        )
        assert list(engine.render(analysis_messages(rec.prompt))) == ex.input_ids[: ex.prompt_len]
        assert prompt.endswith("<|im_start|>assistant\n")
        trajs = list(iter_jsonl(pipeline["collect"] / "trajectories.jsonl", Trajectory))[:2]
        parsed = analyze_with_engine(engine, trajs, max_new_tokens=24)
        assert len(parsed) == 2 and all(hasattr(p, "kept") for p in parsed)
    finally:
        engine.close()


# ------------------------------------------------------------------------------------------------------ label mask


def test_label_mask_matches_the_chat_template_assistant_span_and_trl(tiny_sft, pipeline):
    """Trained labels cover exactly content + <|im_end|> of the assistant turn; TRL's own prompt-completion
    tokenization of the same pair masks the same tokens plus the newline the template writes after <|im_end|>."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    tok = AutoTokenizer.from_pretrained(pipeline["model"])
    records = {r.episode_id: r for r in iter_jsonl(pipeline["annotate"] / "skills.jsonl", SkillRecord)}
    examples = [Example.from_json(r) for r in read_jsonl(tiny_sft["dir"] / "data" / "train.jsonl")][:3]
    pairs = []
    for ex in examples:
        rec = records[ex.episode_id]
        completion = completion_text(rec)
        full = tok.apply_chat_template(
            analysis_messages(rec.prompt) + [{"role": "assistant", "content": completion}], tokenize=False
        )
        head = "<|im_start|>assistant\n"
        start = full.rindex(head) + len(head)
        end = full.index("<|im_end|>", start) + len("<|im_end|>")
        enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
        span = [s >= start and e <= end and e > s for s, e in enc["offset_mapping"]]
        n = len(ex.input_ids)
        assert enc["input_ids"][:n] == ex.input_ids
        assert [label != IGNORE_INDEX for label in ex.labels] == span[:n] and not any(span[n:])
        pairs.append(
            {"prompt": analysis_messages(rec.prompt), "completion": [{"role": "assistant", "content": completion}]}
        )

    args = TRLConfig(
        output_dir=str(tiny_sft["dir"].parent / "trl-check"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        max_length=4096,
        gradient_checkpointing=False,
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(pipeline["model"]),
        args=args,
        train_dataset=Dataset.from_list(pairs),
        processing_class=tok,
    )
    for ex, row in zip(examples, trainer.train_dataset, strict=True):
        trl_mask = [label != IGNORE_INDEX for label in row["labels"]]
        ours = [label != IGNORE_INDEX for label in ex.labels]
        assert row["input_ids"][: len(ex.input_ids)] == ex.input_ids
        assert trl_mask[: len(ours)] == ours
        assert tok.decode(row["input_ids"][len(ex.input_ids) :]).strip() == ""  # only the template's trailing newline


# ------------------------------------------------------------------------------------------------------------ LoRA


def test_lora_export_is_merged_and_matches_the_adapter(pipeline, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seedcli.stages import sft

    cfg = build_config(
        "sft",
        "tiny",
        {
            "runs_dir": str(pipeline["runs"]),
            "from_run": str(pipeline["annotate"]),
            "lora": True,
            "lr": 2e-2,
            "lora_r": 8,
            "lora_alpha": 16,
            "val_fraction": 0.0,
        },
    )
    m = sft.run(cfg)
    run_dir = pipeline["runs"] / "sft" / m.run_id
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    assert not any("lora" in name for name, _ in merged.named_parameters())  # a plain model
    base = AutoModelForCausalLM.from_pretrained(pipeline["model"])
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(pipeline["model"]), run_dir / "adapter")
    tok = AutoTokenizer.from_pretrained(run_dir / "model")
    ex = Example.from_json(next(iter_jsonl(run_dir / "data" / "train.jsonl")))
    ids = torch.tensor([ex.input_ids])
    with torch.no_grad():
        out_merged, out_adapter, out_base = merged(ids).logits, adapter(ids).logits, base(ids).logits
    diff = (out_merged - out_adapter).abs().max().item()
    moved = (out_adapter - out_base).abs().max().item()
    print(f"\nLoRA: merged vs adapter max |Δlogit| {diff:.2e}; adapter vs base {moved:.3f}")
    assert moved > 0.05  # the adapter learned something, so agreement is not trivial
    assert diff < 1e-4
    assert tok.chat_template


# ---------------------------------------------------------------------------------------------------------- resume


class _Interrupt(Exception):
    pass


@pytest.mark.slow
def test_resume_after_interruption_continues_at_the_checkpoint_step(pipeline, monkeypatch, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    from seedcli.stages import sft

    runs = tmp_path / "runs"
    shutil.copytree(pipeline["runs"] / "annotate", runs / "annotate", symlinks=True)
    annotate_dir = runs / "annotate" / pipeline["annotate"].name
    opts = {"runs_dir": str(runs), "from_run": str(annotate_dir), "save_steps": 2, "epochs": 2, "lr": 1e-3}

    straight = sft.run(build_config("sft", "tiny", opts))
    total = straight.metrics["train/steps"]
    assert total > 4

    class KillAtStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise _Interrupt("killed")

    from seedcli.stages import sft_train

    real = sft_train._callbacks
    monkeypatch.setattr(sft_train, "_callbacks", lambda run_dir: real(run_dir) + [KillAtStep3()])
    with pytest.raises(_Interrupt):
        sft.run(build_config("sft", "tiny", opts))
    monkeypatch.setattr(sft_train, "_callbacks", real)
    failed = max((p for p in (runs / "sft").iterdir() if p.is_dir() and not p.is_symlink()), key=lambda p: p.name)
    assert read_manifest(failed).status == "failed"
    assert sorted(p.name for p in (failed / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2"]

    resumed = sft.run(build_config("sft", "tiny", {**opts, "resume": "auto"}))
    assert resumed.run_id == failed.name and resumed.resumed == 1
    assert resumed.metrics["train/resumed_from_step"] == 2
    rows = read_jsonl(failed / "metrics.jsonl")
    train_steps = [r["step"] for r in rows if "train/loss" in r]
    assert train_steps == list(range(1, total + 1))  # step 3 logged once, after the resume; nothing skipped
    assert [r["step"] for r in rows if "val/loss" in r][0] == 0
    # same data order and optimizer state: the resumed run ends where the uninterrupted one did
    a = load_file(runs / "sft" / straight.run_id / "model" / "model.safetensors")
    b = load_file(failed / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"\nresume: max |Δweight| vs the uninterrupted run {worst:.2e}")
    assert worst < 1e-5
    assert torch.allclose(
        torch.tensor(straight.metrics["val/loss_after"]), torch.tensor(resumed.metrics["val/loss_after"]), atol=1e-4
    )


# ------------------------------------------------------------------------------------------------------- bad input


def test_zero_kept_skills_is_a_clear_error(pipeline, tmp_path):
    from seedcli.stages import sft

    runs = tmp_path / "runs"
    annotate_dir = make_annotate_run(runs, pipeline["collect"], [])
    with pytest.raises(UserError, match=r"kept 0 skills: nothing to train on"):
        sft.run(SFTConfig(runs_dir=str(runs), from_run=str(annotate_dir)))
    assert not (runs / "sft").exists()  # nothing started


def test_base_model_without_chat_template_is_a_clear_error(pipeline, tmp_path):
    from seedcli.stages import sft

    bare = tmp_path / "bare"
    shutil.copytree(pipeline["model"], bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path = bare / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(tok_cfg))
    # the bare model is the policy whose episodes sft reads (sft refuses a --model other than that policy)
    from seedcli.stages import annotate

    runs = tmp_path / "runs"
    collect_dir = make_collect_run(runs, bare, make_trajectories())
    done = annotate.run(AnnotateConfig(runs_dir=str(runs), analyzer="rules", from_run=str(collect_dir)))
    with pytest.raises(UserError, match="no chat template"):
        sft.run(SFTConfig(runs_dir=str(runs), from_run=str(runs / "annotate" / done.run_id), model=str(bare)))


def test_prompts_longer_than_max_length_are_cut_and_counted(pipeline, tmp_path):
    from transformers import AutoTokenizer

    from seedcli.stages import sft
    from seedcli.stages.sft import _build_data, _read_skills

    tok = AutoTokenizer.from_pretrained(pipeline["model"])
    records = _read_skills(pipeline["annotate"])
    cfg = SFTConfig(val_fraction=0.2)
    full, _, _ = _build_data(cfg, tok, records, pipeline["collect"], 2048)
    longest = max(len(e.input_ids) for e in full)
    limit = longest - 40
    train, val, stats = _build_data(cfg, tok, records, pipeline["collect"], limit)
    assert stats.truncated >= 1 and stats.dropped_too_long == 0 and stats.cut_steps >= stats.truncated
    assert all(len(e.input_ids) <= limit for e in train + val)
    assert sum(e.cut_steps > 0 for e in train + val) == stats.truncated
    # far too short for even the prompt skeleton: every example is dropped, which is an error naming the fix
    with pytest.raises(UserError, match="raise --max-length"):
        _build_data(cfg, tok, records, pipeline["collect"], 64)
    # the stage reports the count in the manifest
    m = sft.run(
        build_config(
            "sft",
            "tiny",
            {
                "runs_dir": str(tmp_path / "r"),
                "from_run": str(pipeline["annotate"]),
                "max_length": limit,
                "epochs": 0.1,
            },
        )
    )
    assert m.metrics["data/truncated"] == stats.truncated and m.metrics["data/max_length"] == limit


def test_show_samples_prints_masked_tokens_and_exits(pipeline):
    from typer.testing import CliRunner

    from seedcli.cli import app

    before = set((pipeline["runs"] / "sft").iterdir()) if (pipeline["runs"] / "sft").exists() else set()
    result = CliRunner().invoke(
        app, ["sft", "-c", "tiny", "--runs-dir", str(pipeline["runs"]), "--show-samples", "2"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    legend, out = result.output.split("\n", 1)
    assert "loss mask" in legend
    assert out.count("prompt tokens") == 2 and out.count("⟦") == 2
    loss_spans = [s.split("⟧")[0] for s in out.split("⟦")[1:]]
    for span in loss_spans:
        assert span.startswith('{"episode_summary": ') and span.endswith("<|im_end|>")
    after = set((pipeline["runs"] / "sft").iterdir()) if (pipeline["runs"] / "sft").exists() else set()
    assert after == before  # no run was started


# ------------------------------------------------------------------------------------------------ data-parallel path


@pytest.mark.slow
def test_torchrun_path_trains_data_parallel_on_two_cpu_ranks(tiny_sft, pipeline, tmp_path):
    """The `--gpus N` launcher, run with two CPU ranks (gloo): the ranks split the data (half the optimizer steps of
    one process at the same per-device batch) and rank 0 alone writes metrics.jsonl and model/."""
    from seedcli.stages import sft

    run_dir = tmp_path / "ddp"
    shutil.copytree(tiny_sft["dir"] / "data", run_dir / "data")
    cfg = build_config("sft", "tiny", {"runs_dir": str(pipeline["runs"]), "lr": 1e-3})
    sft._launch(run_dir, cfg, pipeline["model"], "cpu", 2)
    single = read_manifest(tiny_sft["dir"]).metrics["train/steps"]
    summary = sft._summary(run_dir)
    assert summary["train/steps"] == single // 2
    assert summary["val/loss_after"] < summary["val/loss_before"]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows if "train/loss" in r] == list(range(1, single // 2 + 1))  # one writer
    assert (run_dir / "model" / "model.safetensors").exists() and (run_dir / "model" / "chat_template.jinja").exists()
