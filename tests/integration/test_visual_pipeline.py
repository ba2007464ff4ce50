"""A vision-language policy through the pipeline on CPU: the tiny Qwen2.5-VL plays Sokoban and EZPoints from images
(collect), the rules analyzer writes skills, sft fine-tunes it to write them, rl trains with images in every pass (rollout, ℓ_old, ℓ_ref, the teacher
with the skill block, the update) and eval plays the test split; images are stored once per run as PNGs and hashed
in the manifest. And the proof that re-scoring sees the images: ℓ_old of a turn equals the log-probs the policy
sampled it with, which it does not when the image is left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.fake_chat_server import FakeChatServer
from tests.helpers_cli import seed_cli, summary

torch.set_num_threads(2)

IMAGE = "{observation: image}"


@pytest.fixture(scope="module")
def tiny_vl(tmp_path_factory) -> Path:
    from seedcli.engines.vision import build_tiny_vl_model
    from seedcli.envs import template_texts

    return build_tiny_vl_model(tmp_path_factory.mktemp("models") / "tiny-vl", corpus=template_texts())


def test_rescoring_sees_the_images(tiny_vl):
    from seedcli.engines import load_engine
    from seedcli.engines.base import content_parts
    from seedcli.engines.vision import expand_image_tokens, vision_inputs
    from seedcli.envs import get_env
    from seedcli.envs.pool import EnvPool
    from seedcli.images import ImageStore
    from seedcli.rl.logprobs import Scorer
    from seedcli.rl.rescore import rescore_samples
    from seedcli.rl.samples import build_turn_samples, render_samples
    from seedcli.rollout import EpisodeSpec, ModelPolicy, RolloutSettings, play_episodes

    env = get_env("sokoban", observation="image")
    engine = load_engine("hf", tiny_vl, device="cpu")
    store = ImageStore(None)
    settings = RolloutSettings(max_steps=2, history=2, temperature=1.0, max_new_tokens=6, seed=3)
    episodes = []
    with EnvPool(env, 0) as pool:
        specs = [EpisodeSpec(f"e{i}", "g0", task=t) for i, t in enumerate(env.list_tasks("test")[:2])]
        play_episodes(specs, ModelPolicy(engine, settings), pool, settings, {}, episodes.append, images=store)
    image_id = engine.model.config.image_token_id

    def pixels(row):
        return [store.pixels(sha) for sha in row]

    def render(text, images=None):
        ids = engine.render([{"role": "user", "content": content_parts(text) if images else text}])
        if not images:
            return ids
        return expand_image_tokens(ids, image_id, vision_inputs(engine.image_processor, [pixels(images)]).tokens[0])

    def vision(rows):
        batch = vision_inputs(engine.image_processor, [pixels(r) for r in rows])
        return {"pixel_values": batch.pixel_values, "image_grid_thw": batch.image_grid_thw}

    scorer = Scorer(engine.model).eval()
    samples = build_turn_samples(episodes, [None] * len(episodes), None, insert_skill=env.insert_skill)
    assert samples and all(len(s.images) == 1 for s in samples)
    render_samples(samples, range(len(samples)), render)
    rescore_samples(samples, old_fn=scorer, ref_fn=None, teacher=False, max_tokens=4096, pad_id=0, vision=vision)
    sampled = [torch.tensor(episodes[s.episode_index].turns[s.turn_index].logprobs) for s in samples]
    gap = max(float((s.old_logp - lp).abs().max()) for s, lp in zip(samples, sampled, strict=True))
    assert gap < 1e-3, f"ℓ_old differs from the sampling log-probs by {gap}"

    # the same samples re-scored without their images (text ids, no pixels) do not reproduce them
    for s in samples:
        s.images = []
    render_samples(samples, range(len(samples)), render)
    rescore_samples(samples, old_fn=scorer, ref_fn=None, teacher=False, max_tokens=4096, pad_id=0)
    blind = max(float((s.old_logp - lp).abs().max()) for s, lp in zip(samples, sampled, strict=True))
    assert blind > 10 * max(gap, 1e-5)
    engine.close()


@pytest.mark.slow  # every stage of a vision-language model, twice
@pytest.mark.parametrize("env", ["sokoban", "ezpoints"])
def test_tiny_vl_pipeline_on_cpu(tmp_path, tiny_vl, env):
    runs = tmp_path / "runs"
    common = ["--env", env, "--env-options", IMAGE, "--runs-dir", str(runs), "--json"]
    collect = summary(seed_cli("collect", *common, "--model", str(tiny_vl), "--tasks", "2", "--rollouts", "2",
                               "--max-steps", "2", "--max-new-tokens", "12"))  # fmt: skip
    assert collect["metrics"]["images"] >= 2
    collect_dir = runs / "collect" / collect["run_id"]
    manifest = json.loads((collect_dir / "manifest.json").read_text())
    pngs = sorted(p.name for p in (collect_dir / "images").glob("*.png"))
    assert pngs and all(f"images/{name}" in {o["path"] for o in manifest["outputs"]} for name in pngs)
    trajectories = [json.loads(line) for line in (collect_dir / "trajectories.jsonl").read_text().splitlines()]
    step_images = {t["episode_id"]: [turn["image"] for turn in t["turns"]] for t in trajectories}

    # an OpenAI-compatible analyzer gets one multi-image prompt per episode: every step's image, in order
    with FakeChatServer() as server:
        seed_cli("annotate", "--analyzer", "openai", "--base-url", server.url, "--model", "vl-analyst",
                 "--runs-dir", str(runs))  # fmt: skip
        sent = [entry["images"] for entry in server.log]
    assert {tuple(v) for v in sent} == {tuple(v) for v in step_images.values()}
    assert len(sent) <= len(step_images)  # episodes with the same prompt and images share one request
    skills = [json.loads(line) for line in (runs / "annotate" / "latest" / "skills.jsonl").read_text().splitlines()]
    assert skills and all(r["prompt_version"] == "analysis-visual-v1" for r in skills)
    assert all(r["images"] == step_images[r["episode_id"]] for r in skills)

    seed_cli("annotate", "--analyzer", "rules", "--runs-dir", str(runs))
    sft = summary(seed_cli("sft", "--runs-dir", str(runs), "--epochs", "1", "--max-length", "2048", "--json"))
    sft_dir = runs / "sft" / sft["run_id"]
    assert (sft_dir / "model" / "preprocessor_config.json").is_file()  # the fine-tuned VLM keeps its image processor
    # sft trained on the image analysis prompts: each example's image pads expanded, its images kept with the data
    image_id = json.loads((tiny_vl / "config.json").read_text())["image_token_id"]
    rows = [json.loads(line) for line in (sft_dir / "data" / "train.jsonl").read_text().splitlines()]
    assert rows and all(r["images"] for r in rows)
    assert all(r["input_ids"].count(image_id) == 9 * len(r["images"]) for r in rows)  # a 96x96 or 300x300 image: 9
    kept = {o["path"] for o in json.loads((sft_dir / "manifest.json").read_text())["outputs"]}
    assert {f"data/images/{sha}.png" for r in rows for sha in r["images"]} <= kept

    # rl: π_old analyses its own episodes from their images (sokoban), or the static skills drive the teacher pass
    analyzer = "self" if env == "sokoban" else f"static:{runs}/annotate/latest"
    rl = summary(seed_cli("rl", *common, "--steps", "1", "--batch-tasks", "2", "--group", "2", "--max-steps", "2",
                          "--max-new-tokens", "8", "--analyzer", analyzer))  # fmt: skip
    rl_dir = runs / "rl" / rl["run_id"]
    metrics = [json.loads(line) for line in (rl_dir / "metrics.jsonl").read_text().splitlines()]
    if analyzer == "self":  # every episode was analysed: a kept skill or a parse rejection, none skipped
        analysed = metrics[-1]["opd/valid_skill_frac"] * 4 + sum(
            v for k, v in metrics[-1].items() if k.startswith("analyzer/rejected/")
        )
        assert analysed == 4 and metrics[-1]["timing_s/analyze"] > 0
    else:
        assert metrics[-1]["opd/token_frac"] > 0 and metrics[-1]["opd/loss"] != 0  # the teacher pass, with images
        # the leak audit read the static skills: the rules skills name no card of the game
        assert metrics[-1]["skills/leak_frac"] == 0.0 and "skills/leak_frac/ezpoints" in metrics[-1]
    assert any(o["path"].startswith("images/") for o in json.loads((rl_dir / "manifest.json").read_text())["outputs"])

    ev = summary(seed_cli("eval", *common, "--from", str(rl_dir), "--limit", "2", "--max-new-tokens", "8"))
    assert ev["metrics"]["games"] == 2 and ev["metrics"]["images"] >= 2

    # a changed image makes the collect run refused like any other changed output
    victim = collect_dir / "images" / pngs[0]
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    proc = seed_cli("annotate", "--analyzer", "rules", "--runs-dir", str(runs), "--from", str(collect_dir),
                    check=False)  # fmt: skip
    assert proc.returncode == 2 and "sha256" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_fsdp_ranks_shard_the_vision_tower_and_match_one_process(tmp_path, tiny_vl):
    """Two gloo ranks under FSDP2 with unequal shares (3 rollouts of one room): the vision blocks are sharded with
    the text layers, the rank with less work runs padding forwards on a blank image (no hang), and the first update
    equals one process's."""
    (tmp_path / "skills.json").write_text(json.dumps({"sokoban": "Walk behind the box, then push it to the target."}))
    first = {}
    for nproc in (1, 2):
        runs = tmp_path / f"runs{nproc}"
        out = summary(seed_cli("rl", "--env", "sokoban", "--env-options", IMAGE, "--model", str(tiny_vl), "--nproc",
                               str(nproc), "parallel=fsdp", "--steps", "1", "--batch-tasks", "1", "--group", "3",
                               "--max-steps", "3", "--max-new-tokens", "8", "micro_batch_tokens=64", "--analyzer",
                               f"static:{tmp_path / 'skills.json'}", "--runs-dir", str(runs), "--json"))  # fmt: skip
        rec = json.loads((runs / "rl" / out["run_id"] / "metrics.jsonl").read_text().splitlines()[-1])
        first[nproc] = rec
    two = first[2]
    assert two["dist/padding_micro_batches"] + two["dist/padding_forwards_rescore"] > 0
    assert two["opd/token_frac"] > 0
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "opd/loss", "opd/gate_mean", "actor/grad_norm"):
        assert abs(first[1][key] - two[key]) < 1e-4, key
