"""`seed probe`: what a skill does to the teacher, measured without training (docs/method-check.md, "Does the skill
teach?").

SEED's OPD term reads one number per sampled token: how much more (or less) likely the policy finds it once a skill
is in its prompt, Δ = ℓ_skill − ℓ_θ. This stage takes the episodes of a collect or eval run (played by a model or by
the expert) and re-scores every response token under the ordinary prompt (ℓ_none) and under each context a skill
can give, with the skill block where `seed rl`'s teacher prompt puts it (`Environment.insert_skill`):

    null             a neutral text of about the skill's length: what the block's presence alone does
    own              the episode's own skill (`skills`: self = the model writes it from the episode, as `seed rl
                     --analyzer self`; rules; hindsight; an annotate run of these episodes)
    shuffled         the own skill of an episode of another task
    oracle           the environment's privileged knowledge of the task (`Environment.oracle_skill`: the expert's
                     plan, EZPoints' formula, search's answer): the bound on what the channel can carry
    oracle_shuffled  the oracle of another task: the control for the oracle

It reports Δ on the tokens that spell the action and on the others, for won and lost episodes
(`seedcli/report/probe.py`), the correlation of each episode's mean Δ with its advantage, and with `play N` the
success of N tasks played again with each context in every turn's prompt against without it (the own skill there is
the one written after the run's attempt at the same task). Writes probe.json, probe.png, skills.jsonl and
play_<context>.jsonl (resumable) in runs/probe/<id>/.

`measure: absorption` reads what distillation moves off the student instead: the run's episodes, played
by the expert, are a fixed panel of states; at each, the model's log-prob with no skill in its prompt of the expert's
action tokens, and the teacher gap ℓ_oracle − ℓ_none on the model's own sample there (one sample a state, its seed
fixed by the state, so two models on one panel draw alike). One row per episode in absorption.jsonl; `baseline` (the
start model's probe on the same panel) pairs them episode by episode: an arm that absorbed its oracle-informed
teacher shows the expert's action tokens up and the gap closing toward 0 (it starts below: on the model's own
samples a self-teacher's gap is about −KL(π_none ‖ π_oracle)) against its start.

    seed eval --env webshop --policy expert --split train --limit 32 --runs-dir runs/panel     # the training panel
    seed probe --env webshop --from runs/panel/eval/latest --model START --measure absorption
    seed probe --env webshop --from runs/panel/eval/latest --model ARM --measure absorption --baseline runs/probe/<start>
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import torch
from rich.console import Console

from seedcli.analyzers.policy import analyze_with_engine
from seedcli.artifacts import Manifest, model_run, open_run, verify_run
from seedcli.config.probe import ProbeConfig
from seedcli.envs.base import Environment
from seedcli.envs.hindsight import ReplayMismatch
from seedcli.errors import UserError
from seedcli.precision import compute_dtype
from seedcli.progress import StageProgress
from seedcli.records import SkillRecord, Trajectory, iter_jsonl, write_jsonl
from seedcli.report.probe import (
    CONTEXTS,
    TurnScores,
    absorption_paired,
    absorption_rows,
    absorption_summary,
    absorption_table,
    contrasts,
    paired_gap,
    plot,
    summarise,
    table,
)
from seedcli.rl.analyse import other_skills
from seedcli.rl.logprobs import Scorer, score_responses
from seedcli.rl.samples import Reward, group_advantages
from seedcli.rollout import EpisodeSpec, ModelPolicy
from seedcli.stages.common import (
    chain_model,
    check_model_dir,
    check_model_sees,
    load_policy_engine,
    make_env,
    play_to_file,
    settings_from,
)

NULL_TEXT = (
    "This note carries no information about the task or how to solve it; read the task and what you see as usual, "
    "and answer in the format asked for."
)
EPISODE_FILES = {"collect": "trajectories.jsonl", "eval": "episodes.jsonl"}
SCORE_CHUNK = 128  # replies scored per call (the progress line moves between calls)
SKILL_CHUNK = 16  # episodes whose own skill is written per call (likewise)


def null_skill(length: int) -> str:
    """The neutral text, repeated and cut at a word to about `length` characters (at least one sentence)."""
    words, text = NULL_TEXT.split(), ""
    i = 0
    while len(text) < max(length, len(NULL_TEXT) // 2) or i < 1:
        text = f"{text} {words[i % len(words)]}".strip()
        i += 1
    return text


def action_mask(tokenizer: Any, response_ids: Sequence[int], action: str) -> list[bool]:
    """Which response tokens spell the action: those whose characters overlap the last occurrence of `action` in the
    decoded reply (the parsers read the action last: a JSON field, a tag), matched without case where lowering keeps
    the text's length (WebShop's parser lowercases the action); all False when it does not occur."""
    ids = list(response_ids)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    if len(full.lower()) == len(full):
        full, action = full.lower(), action.lower()
    start = full.rfind(action) if action.strip() else -1
    if start < 0:
        return [False] * len(ids)
    end = start + len(action)
    mask, prev = [], 0
    for i in range(len(ids)):
        upto = len(tokenizer.decode(ids[: i + 1], skip_special_tokens=True))
        mask.append(prev < end and upto > start and upto > prev)
        prev = upto
    return mask


def _episode_run(cfg: ProbeConfig) -> tuple[Path, Manifest, list[Trajectory]]:
    if not cfg.from_run:
        raise UserError("seed probe needs --from RUN: a collect or eval run whose episodes it re-scores")
    src = Path(cfg.from_run)
    if not src.exists():
        raise UserError(f"--from {src}: no such directory")
    manifest = verify_run(src, tuple(EPISODE_FILES), runs_dir=cfg.runs_dir)
    episodes = sorted(iter_jsonl(src / EPISODE_FILES[manifest.stage], Trajectory), key=lambda e: e.episode_id)
    if not episodes:
        raise UserError(f"--from {src}: the run holds no episodes")
    if episodes[0].env != cfg.env:
        raise UserError(f"--from {src}: its episodes are {episodes[0].env}'s; pass --env {episodes[0].env}")
    if any(t.image for ep in episodes for t in ep.turns):
        raise UserError(
            f"--from {src}: its episodes were played from images; the probe scores text prompts (play them with "
            "env_options '{observation: text}')"
        )
    return src, manifest, episodes[: cfg.episodes]


def _own_skills(cfg: ProbeConfig, env: Environment, engine, episodes: list[Trajectory], out: Path) -> list[str | None]:
    """Each episode's own skill (None where there is none), kept in `out` (skills.jsonl) for a resume and a reader."""
    if out.exists():
        rows = {r["episode_id"]: r.get("skill") for r in map(orjson.loads, out.read_bytes().splitlines())}
        if all(ep.episode_id in rows for ep in episodes):
            return [rows[ep.episode_id] for ep in episodes]
    spec = cfg.skills.strip()
    reasons: list[str | None] = [None] * len(episodes)
    if spec == "none":
        skills: list[str | None] = [None] * len(episodes)
    elif spec == "rules":
        skills = [env.rules_skill(ep)[1] or None for ep in episodes]
    elif spec == "hindsight":  # the episode replayed against the expert (`seed annotate --analyzer hindsight`)
        skills = [None] * len(episodes)
        for i, ep in enumerate(episodes):
            try:
                skills[i] = env.hindsight_skill(ep)[1] or None
            except ReplayMismatch as exc:  # as annotate and rl: that episode has no skill, and the reason says why
                reasons[i] = f"hindsight_replay_mismatch: {exc}"
    elif spec == "self":
        parsed = []
        with StageProgress("probe own skills", len(episodes)) as progress:
            for i in range(0, len(episodes), SKILL_CHUNK):  # in chunks, so that progress shows on long runs
                chunk = episodes[i : i + SKILL_CHUNK]
                parsed += analyze_with_engine(
                    engine, chunk, cfg.analyzer_max_new_tokens, temperature=0.0, seed=cfg.seed + i,
                    max_prompt_chars=cfg.analysis_max_chars,
                )  # fmt: skip
                progress.advance(len(chunk), kept=sum(p.kept for p in parsed))
        skills = [p.skill if p.kept else None for p in parsed]
        reasons = [p.reason for p in parsed]
    else:
        run = Path(spec)
        verify_run(run, "annotate", runs_dir=cfg.runs_dir)
        by_id = {r.episode_id: r.episode_skill for r in iter_jsonl(run / "skills.jsonl", SkillRecord)}
        if not any(ep.episode_id in by_id for ep in episodes):
            raise UserError(f"--skills {run}: the annotate run holds no skill of these episodes (annotate --from them)")
        skills = [by_id.get(ep.episode_id) for ep in episodes]
    rows = zip(episodes, skills, reasons, strict=True)
    write_jsonl(out, [{"episode_id": e.episode_id, "skill": s, "reason": r} for e, s, r in rows])
    return skills


def context_skills(env: Environment, episodes: list[Trajectory], own: list[str | None], seed: int) -> dict:
    """The skill each context gives each episode (None: that episode is not scored in that context)."""
    oracle = [env.oracle_skill(ep) for ep in episodes]
    reference = [o or x for o, x in zip(own, oracle, strict=True)]  # the null text matches the own skill's length
    return {
        "null": [null_skill(len(r)) if r else null_skill(len(NULL_TEXT)) for r in reference],
        "own": own,
        "shuffled": other_skills(episodes, own, seed, other_task=True),
        "oracle": oracle,
        "oracle_shuffled": other_skills(episodes, oracle, seed + 1, other_task=True),
    }


def _play(cfg: ProbeConfig, env: Environment, engine, meta: dict, episodes, skills: dict, run) -> dict[str, Any]:
    """The first `cfg.play` tasks of the episodes played again under no skill and under each context; per context the
    paired success gap against none over the tasks that context gives a skill."""
    firsts: dict[str, int] = {}
    for i, ep in enumerate(episodes):
        firsts.setdefault(ep.task_id, i)
    chosen = list(firsts.items())[: cfg.play]
    tasks = {t.task_id: t for t in env.list_tasks(env.resolve_split(episodes[0].split))}
    policy = ModelPolicy(engine, settings_from(cfg), cfg.gen_batch)
    won: dict[str, dict[str, bool]] = {}
    for ctx in ("none", *CONTEXTS):
        specs = [
            EpisodeSpec(f"p{k:04d}", task_id, tasks[task_id], None if ctx == "none" else skills[ctx][i])
            for k, (task_id, i) in enumerate(chosen)
            if task_id in tasks and (ctx == "none" or skills[ctx][i])
        ]
        if not specs:
            continue
        played, _ = play_to_file(f"probe {ctx}", specs, policy, cfg, meta, run.file(f"play_{ctx}.jsonl"), env=env)
        won[ctx] = {e.task_id: e.won for e in played}
    return {ctx: paired_gap(won["none"], won[ctx]) for ctx in CONTEXTS if ctx in won and "none" in won}


def _scorer(model_dir: Path, cfg: ProbeConfig):
    """π's log-probs as `seed rl`'s teacher pass computes them: fp32 weights, bf16 autocast where the dtype is bf16."""
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          cfg.device if cfg.device != "auto" else "cpu")  # fmt: skip
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    compute = compute_dtype(cfg.dtype, device)
    # the rows of a micro-batch that begin alike (one game's turns, its contexts) run their common prefix once, as in rl
    return Scorer(lm, compute_dtype=compute if compute == torch.bfloat16 else None, share_prefix=True), device


def _baseline_rows(cfg: ProbeConfig, source: Manifest) -> list[dict] | None:
    """The absorption rows of `cfg.baseline` (a complete probe run that measured absorption on the panel `source`,
    drawing its own samples alike), or None."""
    if not cfg.baseline:
        return None
    base = Path(cfg.baseline)
    if not base.exists():
        raise UserError(f"--baseline {base}: no such directory")
    manifest = verify_run(base, "probe", runs_dir=cfg.runs_dir)
    path = base / "absorption.jsonl"
    if not path.exists():
        raise UserError(f"--baseline {base}: that probe did not measure absorption (run it with --measure absorption)")
    problem = baseline_problem(cfg, source, manifest, orjson.loads((base / "probe.json").read_bytes()))
    if problem:
        raise UserError(problem)
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def panel_problem(cfg: ProbeConfig, episodes: list[Trajectory]) -> str:
    """Why `episodes` cannot be absorption's panel ("" when they can): it scores their actions as the expert's."""
    played = sorted({ep.policy for ep in episodes} - {"expert"})
    if not played:
        return ""
    return (
        f"--measure {cfg.measure} scores the panel's actions as the expert's, and --from {cfg.from_run}'s episodes "
        f"were played by the {' and '.join(played)} policy: play the panel with `seed eval --policy expert`"
    )


def baseline_problem(cfg: ProbeConfig, source: Manifest, baseline: Manifest, result: dict) -> str:
    """Why the probe `baseline` (its manifest and probe.json) cannot pair with this one ("" when it can): another
    panel (episode ids repeat across runs: e0000 is every eval's first), or its own samples drawn otherwise."""
    panel = [i.run_id for i in baseline.inputs if i.stage in EPISODE_FILES]
    if source.run_id not in panel:
        return (
            f"--baseline {cfg.baseline} probed the episodes of {', '.join(panel) or 'no run'}, not those of --from "
            f"{cfg.from_run} ({source.run_id}): pair two probes of the same panel"
        )
    drawn = result.get("absorption") or {}
    for key in ("temperature", "max_new_tokens"):
        if drawn.get(key) != getattr(cfg, key):
            return (
                f"--baseline {cfg.baseline} drew the model's own samples with {key}={drawn.get(key)}, this probe with "
                f"{getattr(cfg, key)}: give both the same {key}"
            )
    return ""


def _score_pairs(scorer, device, pad: int, cfg: ProbeConfig, pairs: dict[str, list], label: str) -> None:
    """Score every (turn, (prompt ids, response ids)) of `pairs` into turn.logp[context], in chunks, with progress."""
    with StageProgress(label, sum(map(len, pairs.values()))) as progress:
        for ctx, items in pairs.items():
            for i in range(0, len(items), SCORE_CHUNK):  # in chunks, so that progress shows on long runs
                chunk = items[i : i + SCORE_CHUNK]
                logps = score_responses(
                    scorer, [p for _, p in chunk], max_tokens=cfg.micro_batch_tokens, pad_id=pad, device=device
                )
                for (turn, _), lp in zip(chunk, logps, strict=True):
                    turn.logp[ctx] = lp
                progress.advance(len(chunk), context=ctx)


def run(cfg: ProbeConfig) -> Manifest:
    src, source, episodes = _episode_run(cfg)
    env = make_env(cfg)
    model_dir = check_model_dir(cfg.model)
    check_model_sees(env, model_dir, "--model")
    chained = model_run(model_dir)
    do_contexts, do_absorb = cfg.measure in ("contexts", "both"), cfg.measure in ("absorption", "both")
    if do_absorb and (problem := panel_problem(cfg, episodes)):
        raise UserError(problem)
    baseline = _baseline_rows(cfg, source)
    reward = Reward(env.success_reward, env.invalid_penalty)
    scores = torch.tensor([reward.episode(ep) for ep in episodes], dtype=torch.float64)
    advantages = group_advantages(scores, [ep.group_id for ep in episodes], traj_ids=[ep.episode_id for ep in episodes])
    with open_run("probe", cfg) as run:
        run.add_input(source.stage, src, source)
        chain_model(run, model_dir, chained)  # its run, or its weights' hash (and a Hub model's repo and commit)
        t0 = time.time()
        engine, meta = load_policy_engine(cfg, model_dir)
        play: dict[str, Any] = {}
        own_turns: list[TurnScores] = []
        try:
            if do_contexts:
                own = _own_skills(cfg, env, engine, episodes, run.file("skills.jsonl"))
                skills = context_skills(env, episodes, own, cfg.seed)
                play = _play(cfg, env, engine, meta, episodes, skills, run) if cfg.play else {}
                turns, pairs = _contexts(engine, env, episodes, skills, advantages.tolist())
            else:
                skills = {"oracle": [env.oracle_skill(ep) for ep in episodes]}
                turns, pairs = _contexts(engine, env, episodes, skills, advantages.tolist(), contexts=())
            if do_absorb:
                if not any(skills["oracle"]):
                    raise UserError(f"--measure absorption: {env.name} gives no oracle skill for these tasks")
                own_turns, own_pairs = _own_samples(cfg, engine, env, episodes, skills["oracle"])
        finally:
            engine.close()
        scorer, device = _scorer(model_dir, cfg)
        pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else 0
        _score_pairs(scorer, device, pad, cfg, pairs, "probe scoring")
        result: dict[str, Any] = {
            "episodes": len(episodes),
            "won": sum(ep.won for ep in episodes),
            "run": str(src),
            "model": str(model_dir),
            "measure": cfg.measure,
        }
        if do_contexts:
            result.update(skills=cfg.skills, contexts=summarise(turns), contrasts=contrasts(turns), play=play)
        outputs: dict[str, int | None] = {"probe.json": None}
        if do_absorb:
            _score_pairs(scorer, device, pad, cfg, own_pairs, "probe absorption")
            rows = absorption_rows([ep.episode_id for ep in episodes], turns, own_turns)
            write_jsonl(run.file("absorption.jsonl"), rows)
            outputs["absorption.jsonl"] = len(rows)
            result["absorption"] = {"episodes": [r["episode_id"] for r in rows], "summary": absorption_summary(rows),
                                    "temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens}  # fmt: skip
            if baseline is not None:
                result["absorption_vs_baseline"] = absorption_paired(baseline, rows)
                result["baseline"] = str(cfg.baseline)
        result["wall_time_s"] = round(time.time() - t0, 1)
        run.file("probe.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        console = Console(stderr=True)
        if do_contexts:
            plot(result, run.file("probe.png"))
            console.print(table(result))
            outputs.update({"probe.png": None, "skills.jsonl": len(episodes)})
            outputs.update(
                {f"play_{c}.jsonl": None for c in ("none", *CONTEXTS) if run.file(f"play_{c}.jsonl").exists()}
            )
        if do_absorb:
            console.print(absorption_table(result))
        return run.complete(outputs, _headline(result))


def _own_samples(cfg: ProbeConfig, engine, env: Environment, episodes, oracle: list[str | None]):
    """The model's own reply at every state of the panel (one sample each, at `cfg.temperature`, its seed fixed by
    the episode and turn, so another model on the same panel draws with the same seeds), as TurnScores with the
    (prompt ids, reply ids) pairs to score under none and under the episode's oracle."""
    states = [(e, k, turn) for e, ep in enumerate(episodes) if oracle[e] for k, turn in enumerate(ep.turns)]
    render = lambda text: list(engine.render([{"role": "user", "content": text}]))  # noqa: E731
    turns: list[TurnScores] = []
    pairs: dict[str, list] = {"none": [], "oracle": []}
    with StageProgress("probe own samples", len(states)) as progress:
        for i in range(0, len(states), cfg.gen_batch):
            chunk = states[i : i + cfg.gen_batch]
            prompts = [render(turn.prompt) for _, _, turn in chunk]
            seeds = [cfg.seed * 1_000_003 + e * 1_000 + k for e, k, _ in chunk]
            outs = engine.generate(prompts, temperature=cfg.temperature, top_p=cfg.top_p,
                                   max_new_tokens=cfg.max_new_tokens, seeds=seeds)  # fmt: skip
            for (e, _, turn), prompt, out in zip(chunk, prompts, outs, strict=True):
                reply = list(out.token_ids)
                if not reply:
                    continue
                action, _ = env.parse_action(out.text)
                ts = TurnScores(e, episodes[e].won, 0.0, action_mask(engine.tokenizer, reply, action))
                turns.append(ts)
                pairs["none"].append((ts, (prompt, reply)))
                pairs["oracle"].append((ts, (render(env.insert_skill(turn.prompt, oracle[e])), reply)))
            progress.advance(len(chunk))
    return turns, pairs


def _contexts(engine, env: Environment, episodes, skills: dict, advantages: list[float], contexts=CONTEXTS):
    """Every reply of the episodes as a TurnScores, and per context the (turn, (prompt ids, response ids)) pairs to
    score: the recorded prompt for none, the prompt with the context's skill inserted for the others (`contexts`;
    none alone with ())."""
    turns: list[TurnScores] = []
    pairs: dict[str, list] = {"none": [], **{c: [] for c in contexts}}
    tok = engine.tokenizer

    def render(text: str) -> list[int]:
        return list(engine.render([{"role": "user", "content": text}]))

    for e, (ep, adv) in enumerate(zip(episodes, advantages, strict=True)):
        for turn in ep.turns:
            # a model's reply: the tokens it sampled; the expert's (no tokens): its text as the tokenizer encodes it
            response = list(turn.response_ids) or tok.encode(turn.response, add_special_tokens=False)
            if not response:
                continue
            ts = TurnScores(e, ep.won, adv, action_mask(tok, response, turn.action))
            turns.append(ts)
            pairs["none"].append((ts, (render(turn.prompt), response)))
            for ctx in contexts:
                skill = skills[ctx][e]
                if skill:
                    pairs[ctx].append((ts, (render(env.insert_skill(turn.prompt, skill)), response)))
    return turns, pairs


def _headline(result: dict) -> dict[str, Any]:
    """The manifest's metrics: per context Δ on action tokens (all episodes) and the success gap when played."""
    out: dict[str, Any] = {"episodes": result["episodes"], "won": result["won"]}
    for key, s in result.get("absorption", {}).get("summary", {}).items():
        out[f"absorption/{key}"] = round(s["mean"], 4)
    for key, p in result.get("absorption_vs_baseline", {}).items():
        out[f"absorption_vs_baseline/{key}"] = round(p["mean"], 4)
        out[f"absorption_vs_baseline/{key}_se"] = round(p["se"], 4) if p["se"] == p["se"] else None
    for ctx, entry in result.get("contexts", {}).items():
        out[f"delta_action/{ctx}"] = entry["action"]["all"].get("delta_mean")
        out[f"delta_other/{ctx}"] = entry["other"]["all"].get("delta_mean")
    for name, c in result.get("contrasts", {}).items():
        out[f"contrast_action/{name}"] = c["action_delta_mean"]
    for ctx, gap in result.get("play", {}).items():
        if gap.get("tasks"):
            out[f"success_gap_points/{ctx}"] = round(gap["gap_points"], 2)
    return out
