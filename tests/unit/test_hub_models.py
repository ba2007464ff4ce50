"""Models by Hub id (issue 56 §3): `--model ORG/NAME[@REVISION]` resolves through huggingface_hub's cache, offline
here. The cache is laid out in huggingface_hub's own format (`models--ORG--NAME/{blobs,snapshots/<sha>,refs/<rev>}`,
blobs named as the Hub names them) and checked with huggingface_hub's own reader (`scan_cache_dir`) before any test
trusts it; the stages record the repository and the resolved commit in their manifests."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seedcli.artifacts import read_manifest
from seedcli.cli import app
from seedcli.engines.tiny import model_hash
from tests.helpers_cli import ENV, seed_cli, summary
from tests.helpers_models import build_test_model

REPO = "tiny-org/tiny-agent"
PLAY = ["--env", "sokoban", "--workers", "0", "--max-steps", "1", "--max-new-tokens", "4", "--json"]


def _commit(label: str) -> str:
    return hashlib.sha1(f"{REPO} {label}".encode()).hexdigest()


def add_snapshot(cache: Path, repo: str, model_dir: Path, commit: str, refs: tuple[str, ...]) -> Path:
    """Put `model_dir`'s files into the Hub cache at `cache` as `hf download` leaves them: each file a blob named by
    its git blob sha1 (by its sha256 for the LFS-stored weights), linked from snapshots/<commit>/, and each ref in
    `refs` a file holding the commit. Returns the snapshot directory."""
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils.sha import git_hash, sha_fileobj

    storage = cache / repo_folder_name(repo_id=repo, repo_type="model")
    snapshot = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for f in sorted(model_dir.iterdir()):
        with f.open("rb") as fh:
            blob_id = sha_fileobj(fh).hex() if f.suffix == ".safetensors" else git_hash(f.read_bytes())
        blob = storage / "blobs" / blob_id
        if not blob.exists():
            shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    for ref in refs:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> dict:
    """HF_HOME with REPO at two commits: `main` (the tiny model, seed 0) and tag `v1` (seed 1)."""
    from huggingface_hub import scan_cache_dir

    root = tmp_path_factory.mktemp("hub")
    home, cache = root / "hf_home", root / "hf_home" / "hub"
    models = {label: build_test_model(root / label, seed=seed) for label, seed in (("main", 0), ("v1", 1))}
    snapshots = {label: add_snapshot(cache, REPO, models[label], _commit(label), (label,)) for label in models}
    # huggingface_hub reads the layout back as its own: one model repo, two revisions, each with its ref
    [info] = scan_cache_dir(cache).repos
    assert (info.repo_id, info.repo_type) == (REPO, "model")
    assert {r.commit_hash: set(r.refs) for r in info.revisions} == {_commit("main"): {"main"}, _commit("v1"): {"v1"}}
    return {"home": home, "cache": cache, "snapshots": snapshots, "models": models}


@pytest.fixture
def offline_cache(hub, monkeypatch):
    """huggingface_hub in this process pointed at the test cache, offline (it reads HF_HOME when it is imported, so
    the in-process tests set its constants; the subprocess test sets the environment variables)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert len(text.splitlines()) == 1 and text.startswith("error:") and "Traceback" not in text, text
    return text


def test_seed_collect_plays_a_hub_model_from_the_offline_cache_and_records_its_commit(hub, tmp_path):
    # the user's way: a fresh process, HF_HOME at the cache and HF_HUB_OFFLINE=1 in the environment
    runs = tmp_path / "runs"
    env = {k: v for k, v in ENV.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(HF_HOME=str(hub["home"]), HF_HUB_OFFLINE="1")
    proc = seed_cli("collect", "--model", REPO, "--tasks", "1", "--rollouts", "1", "--runs-dir", str(runs), *PLAY,
                    env=env)  # fmt: skip
    manifest = read_manifest(runs / "collect" / summary(proc)["run_id"])
    assert manifest.status == "complete" and manifest.config["model"] == REPO
    assert manifest.metrics["inputs/model_repo"] == REPO
    assert manifest.metrics["inputs/model_commit"] == _commit("main")
    assert manifest.metrics["inputs/model"] == str(hub["snapshots"]["main"])
    assert manifest.metrics["inputs/model_hash"] == model_hash(hub["models"]["main"])
    with (runs / "collect" / manifest.run_id / "trajectories.jsonl").open() as f:
        assert json.loads(f.readline())["turns"]  # the model played


@pytest.mark.parametrize(
    ("spec", "download"),
    [("tiny-org/not-cached", "hf download tiny-org/not-cached`"), (f"{REPO}@v9", f"hf download {REPO} --revision v9`")],
    ids=["id", "revision"],
)
def test_a_hub_id_missing_from_the_offline_cache_is_one_line_that_says_how_to_download_it(
    offline_cache, tmp_path, spec, download
):
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["collect", "--model", spec, "--tasks", "1", "--runs-dir", str(runs), *PLAY])
    text = _one_line_error(result)
    assert f"--model {spec}: no such directory, and not in the Hugging Face cache {offline_cache['cache']}" in text
    assert "(HF_HUB_OFFLINE=1)" in text and download in text and "HF_HOME" in text
    assert not runs.exists()  # refused before any run directory


def test_a_revision_picks_its_snapshot_and_sft_takes_the_commit_collect_played(offline_cache, tmp_path):
    from seedcli.config import SFTConfig
    from seedcli.stages.sft import _base_model

    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        app, ["collect", "--model", f"{REPO}@v1", "--tasks", "1", "--rollouts", "1", "--runs-dir", str(runs), *PLAY]
    )
    assert result.exit_code == 0, result.output
    collect = runs / "collect" / json.loads(result.stdout.strip().splitlines()[-1])["run_id"]
    metrics = read_manifest(collect).metrics
    assert (metrics["inputs/model_repo"], metrics["inputs/model_commit"]) == (REPO, _commit("v1"))
    assert (
        metrics["inputs/model_hash"]
        == model_hash(offline_cache["models"]["v1"])
        != model_hash(offline_cache["models"]["main"])
    )
    # sft without --model starts from the policy the collect run played: that very commit, whatever v1 says later
    path, recorded = _base_model(SFTConfig(), collect, collect)
    assert (path, recorded) == (offline_cache["snapshots"]["v1"], f"{REPO}@{_commit('v1')}")


def test_every_model_taking_stage_resolves_a_hub_id(offline_cache):
    from seedcli.config import AnnotateConfig, EvalConfig, RLConfig
    from seedcli.engines.base import check_model_dir
    from seedcli.stages.annotate import _key_model
    from seedcli.stages.eval import resolve_model
    from seedcli.stages.rl import resolve_start_model

    main, v1 = offline_cache["snapshots"]["main"], offline_cache["snapshots"]["v1"]
    assert check_model_dir(REPO) == main  # collect, warmstart, probe and the preflight check
    assert check_model_dir(f"{REPO}@{_commit('v1')}") == v1  # a commit, as a tag
    assert resolve_start_model(RLConfig(model=f"{REPO}@v1")) == (v1, None)
    assert resolve_model(EvalConfig(model=REPO)) == (main, None)
    policy = AnnotateConfig(analyzer="policy", model=REPO)
    assert _key_model(policy, "sokoban") == (REPO, "sha256:" + model_hash(main)[:16])


def test_a_local_directory_wins_over_a_hub_id_of_the_same_spelling(offline_cache, tmp_path, monkeypatch):
    from seedcli.engines.base import check_model_dir
    from seedcli.hub import hub_fields

    monkeypatch.chdir(tmp_path)
    shutil.copytree(offline_cache["models"]["v1"], tmp_path / REPO)
    assert check_model_dir(REPO) == Path(REPO)
    assert hub_fields(check_model_dir(REPO)) == {}  # a plain directory: its weights' hash is what the manifest keeps


def test_seed_model_init_copies_a_hub_model_with_its_provenance(offline_cache, tmp_path):
    out = tmp_path / "copy"
    result = CliRunner().invoke(app, ["model", "init", "--model", f"{REPO}@v1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not any(p.is_symlink() for p in out.iterdir())  # the files themselves, not links into the cache
    assert model_hash(out) == model_hash(offline_cache["models"]["v1"])
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance == {"model": f"{REPO}@v1", "hub_repo": REPO, "hub_commit": _commit("v1")}
    assert {p.name for p in out.iterdir()} == {p.name for p in offline_cache["models"]["v1"].iterdir()} | {
        "provenance.json"
    }
