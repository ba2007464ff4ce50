"""`seed annotate`: an analyzer reads every trajectory of a collect run and writes one hindsight skill per episode.

The paper's analyzer (Z.ai's GLM-5.2, temperature 0; needs $ZAI_API_KEY):
    seed annotate --analyzer glm --from runs/collect/<id>
Any OpenAI-compatible server — OpenAI, or a model you serve yourself (`vllm serve MODEL --port 8000`):
    seed annotate --analyzer openai --base-url http://127.0.0.1:8000/v1 --model MODEL --concurrency 64
A local model through the project's engines — one GPU with vLLM, or the CPU with transformers:
    seed annotate --analyzer policy --model runs/sft/<id>/model --engine vllm
Offline baseline (no LLM; not the paper's analyzer), CPU, seconds:
    seed annotate --analyzer rules
The offline stand-in for GLM: each episode replayed against the environment's expert (the turn it left the
expert's path, or the one that won it; privileged, as GLM reading the outcome is), CPU:
    seed annotate --analyzer hindsight --from runs/collect/<id>
After a crash or Ctrl-C, continue the same run; no request whose answer was stored is sent again:
    seed annotate --analyzer glm --from runs/collect/<id> --resume
Eight GPUs: annotation is bound by the API's rate limit, not by GPUs; for `policy`, serve the model with
`vllm serve MODEL --tensor-parallel-size 8` and use `--analyzer openai` against it.

Outputs under runs/annotate/<id>/:
    skills.jsonl     kept records (SkillRecord, reason = null), one per trajectory whose skill passed the parser
    rejected.jsonl   every other trajectory, with its reason and the raw answer
    responses.jsonl  every analyzer answer as it arrived, keyed by sha256 of (analyzer, model, prompt version, prompt,
                     temperature, max tokens, and an HTTP analyzer's base URL) — the cache that makes reruns and
                     resumes send no request twice

Response reuse: a resumed run rebuilds skills/rejected from its own responses.jsonl. A new run of the same collect
run also reuses (copies into its own responses.jsonl) any answer with the same key from earlier annotate runs of that
collect run, complete or not, so a rerun only asks for what is missing; an answer from another endpoint (another
--base-url, even with the same --model name) is another analyzer's and is never reused. Transport failures
(retries exhausted) are rejected as `request_failed` and never cached, so a resume or rerun asks again. A 401/403,
or max(3, concurrency) requests failing in a row (server down, wrong URL), stops the stage at once with a one-line
error (exit 2).
Progress (stderr): done, kept, rejected, retries (transport + schema reminders), tokens.
Skill-leak audit (always on): `skills/leak_frac`, the share of kept skills that leak what only hindsight knows (the
environment's `leaks` rule: the answer, the goal product, where the target was, the moves), overall and
`skills/leak_frac/<category>`, and `skills/leak_chars_frac`, the share of the kept skills' characters inside a leaked
span, in the manifest's metrics and the summary printed at the end.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seedcli.analyzers import (
    PREVIOUS_ANSWER_CHARS,
    AnalyzerResponse,
    analysis_messages,
    make_analyzer,
    request_key,
)
from seedcli.analyzers.http import RequestFailed, resolve
from seedcli.analyzers.parse import ParsedSkill, parse_skill
from seedcli.analyzers.policy import model_fingerprint
from seedcli.artifacts import Manifest, open_run, resolve_input, saved_path, utc_now
from seedcli.config import AnnotateConfig
from seedcli.envs import env_class, get_env
from seedcli.errors import StageFailed, UserError
from seedcli.hub import hub_fields, resolve_model
from seedcli.images import run_images
from seedcli.progress import StageProgress
from seedcli.prompts import ANALYSIS_PROMPT_VERSION, analysis_images, analysis_version, render_trajectory_analysis
from seedcli.records import JsonlWriter, SkillRecord, Trajectory, iter_jsonl, write_jsonl
from seedcli.skill_leaks import LEAK_CHARS_FRAC, LEAK_FRAC, leak_char_metrics, leak_metrics
from seedcli.stages.annotate_cache import ResponseCache, _import_earlier, _tolerant_lines  # noqa: F401

REQUEST_FAILED = "request_failed"
HTTP_ANALYZERS = ("glm", "openai")


@dataclass
class Job:
    """One distinct analysis question (trajectories with identical prompts share it)."""

    key: str
    prompt: str
    version: str  # the analysis prompt's version (text, or visual for an episode played from images)
    images: list[str] = field(default_factory=list)  # sha256 of the images the prompt shows, in order
    trajectories: list[Trajectory] = field(default_factory=list)


def _entry(
    job: Job, attempt: int, analyzer: str, model: str, resp: AnalyzerResponse, base_url: str | None = None
) -> dict:
    return {
        "key": job.key,
        "attempt": attempt,
        "analyzer": analyzer,
        "model": model,
        "base_url": base_url,  # the endpoint that answered (HTTP analyzers; part of the key)
        "prompt_version": job.version,
        "text": resp.text,
        "prompt_tokens": resp.prompt_tokens,
        "completion_tokens": resp.completion_tokens,
        "latency_s": round(resp.latency_s, 4),
        "retries": resp.retries,
        "finish_reason": resp.finish_reason,
        "time": utc_now(),
        "reused_from": None,
    }


def _resolve_analyzer_fields(cfg: AnnotateConfig) -> AnnotateConfig:
    """Preset defaults written into the config, so the manifest says which endpoint and model were used (and the
    variable that held the key — never the key)."""
    update: dict[str, Any] = {}
    if cfg.analyzer in HTTP_ANALYZERS:
        base_url, model, key_env = resolve(cfg.analyzer, cfg.base_url, cfg.model, cfg.api_key_env)
        update = {"base_url": base_url, "model": model, "api_key_env": key_env}
    elif cfg.analyzer == "policy":
        if not cfg.model:
            raise UserError(
                "--analyzer policy needs --model DIR (a Hugging Face model directory, e.g. runs/sft/<id>/model)"
            )
        if not (resolve_model(cfg.model) / "config.json").exists():  # a Hub id ORG/NAME[@REVISION]: its snapshot
            raise UserError(f"--model {cfg.model}: no config.json; pass a Hugging Face model directory")
    return cfg.model_copy(update=update) if update else cfg


def _key_model(cfg: AnnotateConfig, env: str = "alfworld") -> tuple[str, str]:
    """(model as recorded, model identity in cache keys); the rules and hindsight analyzers are versioned per
    environment."""
    if cfg.analyzer in ("rules", "hindsight"):
        cls = env_class(env)
        version = cls.rules_version if cfg.analyzer == "rules" else cls.hindsight_version
        return version, version
    if cfg.analyzer == "policy":
        return str(cfg.model), "sha256:" + model_fingerprint(resolve_model(cfg.model))[:16]
    return str(cfg.model), str(cfg.model)


def _read_trajectories(collect_dir: Path) -> list[Trajectory]:
    path = collect_dir / "trajectories.jsonl"
    if not path.exists():
        raise UserError(f"{collect_dir}: no trajectories.jsonl; pass a collect run with --from")
    seen: dict[str, Trajectory] = {}
    for traj in iter_jsonl(path, Trajectory):
        seen.setdefault(traj.episode_id, traj)
    return list(seen.values())


def _outcome(cache: ResponseCache, key: str) -> tuple[list[dict], ParsedSkill] | None:
    """The final answer for a key from the cache alone, or None when a request is still needed."""
    first = cache.get(key, 0)
    if first is None:
        return None
    parsed = parse_skill(first["text"])
    if parsed.kept:
        return [first], parsed
    second = cache.get(key, 1)
    if second is None:
        return None
    parsed = parse_skill(second["text"])
    parsed.attempts = 2
    return [first, second], parsed


def _record(
    cfg: AnnotateConfig,
    model: str,
    job: Job,
    traj: Trajectory,
    entries: list[dict],
    parsed: ParsedSkill | None,
    error: str | None = None,
    retries: int = 0,
) -> SkillRecord:
    usage: dict[str, Any] = {
        "prompt_tokens": sum(e["prompt_tokens"] for e in entries),
        "completion_tokens": sum(e["completion_tokens"] for e in entries),
        "latency_s": round(sum(e["latency_s"] for e in entries), 4),
        "attempts": len(entries) + (1 if error else 0),
        "retries": sum(e["retries"] for e in entries) + retries,
        "finish_reason": entries[-1]["finish_reason"] if entries else None,
    }
    if len(entries) == 2:
        usage["first_reason"] = parse_skill(entries[0]["text"]).reason
    if error:
        usage["error"] = error
    return SkillRecord(
        episode_id=traj.episode_id,
        key=job.key,
        env=traj.env,
        category=traj.category,
        task=traj.task,
        won=traj.won,
        analyzer=cfg.analyzer,
        model=model,
        prompt_version=job.version,
        prompt=job.prompt,
        images=list(job.images),
        raw=entries[-1]["text"] if entries else "",
        episode_summary=parsed.summary if parsed else None,
        episode_skill=parsed.skill if parsed else None,
        reason=(parsed.reason if parsed else REQUEST_FAILED),
        usage=usage,
    )


def _percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100])."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class _Annotator:
    """The work loop: asks for what the cache lacks, stores every answer, writes one record per trajectory."""

    def __init__(
        self,
        cfg: AnnotateConfig,
        model: str,
        key_model: str,
        cache: ResponseCache,
        analyzer: Any,
        stop: threading.Event,
    ):
        self.cfg = cfg
        self.model = model
        self.key_model = key_model
        self.cache = cache
        self.analyzer = analyzer  # None until needed (the policy analyzer loads a model)
        self.stop = stop
        self.images = run_images(cfg.from_run)  # the collect run's observation images (visual environments)
        self.records: dict[str, SkillRecord] = {}
        self.lock = threading.Lock()
        self.requests = 0
        self.failed_retries = 0
        self.failures_in_a_row = 0

    def _get_analyzer(self) -> Any:
        with self.lock:
            if self.analyzer is None:
                self.analyzer = make_analyzer(self.cfg, self.stop)
            return self.analyzer

    def _store(self, job: Job, attempt: int, resp: AnalyzerResponse) -> dict:
        base_url = self.cfg.base_url if self.cfg.analyzer in HTTP_ANALYZERS else None
        entry = _entry(job, attempt, self.cfg.analyzer, self.key_model, resp, base_url)
        self.cache.put(entry)
        with self.lock:
            self.requests += 1
            self.failures_in_a_row = 0
        return entry

    def _messages(self, job: Job, attempt: int) -> list[dict]:
        # a visual prompt carries its images (read back from the collect run, their sha256 checked)
        images = [self.images.load(sha) for sha in job.images] if job.images else ()
        if attempt == 0:
            return analysis_messages(job.prompt, images=images)
        # over HTTP the retry must fit the server's context: resend only the start of a long failed answer
        limit = PREVIOUS_ANSWER_CHARS if self.cfg.analyzer in HTTP_ANALYZERS else None
        return analysis_messages(job.prompt, self.cache.get(job.key, 0)["text"], limit, images=images)

    def run_one(self, job: Job) -> None:
        """Threaded analyzers: first attempt, then the schema-reminder retry when the answer is rejected."""

        analyzer = self._get_analyzer()
        try:
            for attempt in (0, 1):
                if self.cache.get(job.key, attempt) is None:
                    if self.stop.is_set():
                        return
                    resp = analyzer.analyze(self._messages(job, attempt), job.trajectories[0])
                    self._store(job, attempt, resp)
                if _outcome(self.cache, job.key) is not None:
                    break
        except RequestFailed as exc:
            with self.lock:
                self.failed_retries += exc.retries
                self.failures_in_a_row += 1
                in_a_row = self.failures_in_a_row
            self.finish(job, error=str(exc), retries=exc.retries)
            if in_a_row >= max(3, self.cfg.concurrency) and not self.stop.is_set():
                # a server that is down or a wrong URL: stop instead of failing every remaining record
                self.stop.set()
                raise UserError(
                    f"{in_a_row} requests in a row failed at {self.cfg.base_url} (last: {exc}); check that the "
                    "server is up and --base-url is right, then continue with --resume"
                ) from None
            return
        except BaseException:
            self.stop.set()  # an auth error: no thread starts another request
            raise
        self.finish(job)

    def run_batch(self, jobs: list[Job]) -> None:
        """Batched analyzers: one generate call for the chunk's first attempts, one for its reminders."""
        analyzer = self._get_analyzer()
        for attempt in (0, 1):
            todo = [j for j in jobs if _outcome(self.cache, j.key) is None and self.cache.get(j.key, attempt) is None]
            if not todo:
                continue
            resps = analyzer.analyze_batch(
                [self._messages(j, attempt) for j in todo], [j.trajectories[0] for j in todo]
            )
            for job, resp in zip(todo, resps, strict=True):
                self._store(job, attempt, resp)
        for job in jobs:
            self.finish(job)

    def finish(self, job: Job, error: str | None = None, retries: int = 0) -> None:
        if error:  # keep what did arrive (a first answer whose reminder then failed) in the record
            entries, parsed = [e for e in (self.cache.get(job.key, 0),) if e is not None], None
        else:
            entries, parsed = _outcome(self.cache, job.key)
        for traj in job.trajectories:
            rec = _record(self.cfg, self.model, job, traj, entries, parsed, error, retries)
            with self.lock:
                self.records[traj.episode_id] = rec
                self.on_record(rec)

    def on_record(self, rec: SkillRecord) -> None:  # replaced by the stage to write and report
        pass


def run(cfg: AnnotateConfig) -> Manifest:
    """Annotate a collect run (see the module docstring); returns the completed manifest."""
    collect_dir, collect_manifest = resolve_input("collect", cfg.from_run, cfg.runs_dir)
    cfg = _resolve_analyzer_fields(cfg.model_copy(update={"from_run": str(collect_dir)}))
    trajectories = _read_trajectories(collect_dir)
    envs = sorted({t.env for t in trajectories}) or ["alfworld"]
    model, key_model = _key_model(cfg, envs[0])  # a collect run plays one environment
    stop = threading.Event()
    # the hindsight analyzer replays each episode in the environment as the collect run built it (data, options)
    env = _collect_env(collect_dir, collect_manifest, envs[0]) if cfg.analyzer == "hindsight" else None
    if env is not None and True not in env.expert_modes:
        raise UserError(
            f"--analyzer hindsight replays each episode against the expert, and {env.title} has none; use rules"
        )
    # HTTP, rules and hindsight analyzers are cheap to build: a missing API key fails here, before a run directory
    analyzer = make_analyzer(cfg, stop, env) if cfg.analyzer != "policy" else None

    jobs = _jobs(cfg, key_model, trajectories)

    with open_run("annotate", cfg) as run:
        run.add_input("collect", collect_dir, collect_manifest)
        t0 = time.time()
        cache = ResponseCache(run.file("responses.jsonl"))
        reused = _import_earlier(cache, cfg.runs_dir, run.path, collect_manifest.run_id, set(jobs))
        worker = _Annotator(cfg, model, key_model, cache, analyzer, stop)

        # records that the cache already decides are rebuilt, so a resumed run never holds a duplicate
        pending: list[Job] = []
        for job in jobs.values():
            if _outcome(cache, job.key) is None:
                pending.append(job)
            else:
                worker.finish(job)
        order = {t.episode_id: i for i, t in enumerate(trajectories)}

        def ordered(kept: bool) -> list[SkillRecord]:
            recs = [r for r in worker.records.values() if (r.reason is None) == kept]
            return sorted(recs, key=lambda r: order[r.episode_id])

        write_jsonl(run.file("skills.jsonl"), ordered(True))
        write_jsonl(run.file("rejected.jsonl"), ordered(False))

        tokens = sum(r.usage["prompt_tokens"] + r.usage["completion_tokens"] for r in worker.records.values())
        retries = sum(r.usage["retries"] + (r.usage["attempts"] > 1) for r in worker.records.values())
        try:
            with (
                JsonlWriter(run.file("skills.jsonl")) as skills_out,
                JsonlWriter(run.file("rejected.jsonl")) as rejected_out,
                StageProgress("annotate", len(trajectories), every_s=10.0) as progress,
            ):
                kept = sum(r.reason is None for r in worker.records.values())
                rejected = len(worker.records) - kept
                progress.advance(len(worker.records), kept=kept, rejected=rejected, retries=retries, tokens=tokens)

                def on_record(rec: SkillRecord) -> None:
                    nonlocal tokens, retries, kept, rejected
                    (skills_out if rec.reason is None else rejected_out).write(rec)
                    kept += rec.reason is None
                    rejected += rec.reason is not None
                    tokens += rec.usage["prompt_tokens"] + rec.usage["completion_tokens"]
                    retries += rec.usage["retries"] + (rec.usage["attempts"] > 1)
                    progress.advance(1, kept=kept, rejected=rejected, retries=retries, tokens=tokens)

                worker.on_record = on_record
                if pending:
                    _drive(worker, pending, cfg, stop)
        finally:
            stop.set()
            cache.close()
            if worker.analyzer is not None:
                worker.analyzer.close()

        # final files in trajectory order: the same answers always give the same bytes
        n_kept = write_jsonl(run.file("skills.jsonl"), ordered(True))
        n_rej = write_jsonl(run.file("rejected.jsonl"), ordered(False))
        if n_kept + n_rej != len(trajectories):
            raise RuntimeError(f"{n_kept + n_rej} records for {len(trajectories)} trajectories")
        metrics = _metrics(cfg, model, worker, cache, trajectories, reused, len(pending), time.time() - t0)
        metrics["collect_run"] = collect_manifest.run_id
        if cfg.analyzer == "policy":  # a Hub model: its repository and resolved commit
            metrics.update(hub_fields(resolve_model(cfg.model)))
        metrics.update(_leak_metrics(collect_dir, collect_manifest, trajectories, worker.records))
        _refuse_if_failed(cfg, run, worker, metrics, len(trajectories))
        return run.complete(
            {"skills.jsonl": n_kept, "rejected.jsonl": n_rej, "responses.jsonl": len(cache.entries)}, metrics
        )


def _jobs(cfg: AnnotateConfig, key_model: str, trajectories: list[Trajectory]) -> dict[str, Job]:
    """One job per distinct question: the trajectory's analysis prompt (described for its own environment; the
    visual prompt, with its images, for an episode played from images)."""
    jobs: dict[str, Job] = {}
    for traj in trajectories:
        try:
            version = analysis_version(traj)
        except ValueError as exc:
            raise UserError(f"{cfg.from_run}: {exc}; re-collect the run") from None
        prompt = render_trajectory_analysis(traj, description=env_class(traj.env).analysis_description)
        images = analysis_images(traj, prompt)
        endpoint = cfg.base_url if cfg.analyzer in HTTP_ANALYZERS else None
        # the hindsight analyzer replays the episode in its own task's game, which the prompt need not tell apart (a
        # WebShop instruction two goals share, ALFWorld's trials of one room and goal): one question per task
        asked = f"{traj.split}/{traj.task_id}\n{prompt}" if cfg.analyzer == "hindsight" else prompt
        key = request_key(
            cfg.analyzer, key_model, version, asked, cfg.temperature, cfg.max_tokens, images, endpoint=endpoint
        )
        jobs.setdefault(key, Job(key, prompt, version, images)).trajectories.append(traj)
    return jobs


def _collect_env(collect_dir: Path, collect_manifest: Manifest, name: str):
    """The environment `name` built as the collect run built it (its data root and env options)."""
    saved = collect_manifest.config
    data_root = saved.get("data_root")
    return get_env(
        name,
        data_root=str(saved_path(collect_dir, collect_manifest, data_root)) if data_root else None,
        **(saved.get("env_options") or {}),
    )


def _leak_metrics(
    collect_dir: Path, collect_manifest: Manifest, trajectories: list[Trajectory], records: dict[str, SkillRecord]
) -> dict[str, Any]:
    """The skill-leak audit of the kept skills: `skills/leak_frac`, overall and per category, and
    `skills/leak_chars_frac`, by the environment's `leaks` rule, the environment built as the collect run built it
    (data root, env options). None, with a warning on stderr, when the data the rule reads (search questions, WebShop
    goals) is not there."""
    kept = [(t, records[t.episode_id].episode_skill) for t in trajectories if records[t.episode_id].reason is None]
    if not kept:
        return {LEAK_FRAC: 0.0, LEAK_CHARS_FRAC: 0.0}
    try:
        env = _collect_env(collect_dir, collect_manifest, kept[0][0].env)  # a collect run plays one environment
        episodes, skills = [t for t, _ in kept], [skill for _, skill in kept]
        return {**leak_metrics(env, episodes, skills), **leak_char_metrics(env, episodes, skills)}
    except UserError as exc:
        print(f"[annotate] warning: no skill-leak audit ({exc})", file=sys.stderr)
        return {LEAK_FRAC: None, LEAK_CHARS_FRAC: None}


def _refuse_if_failed(cfg: AnnotateConfig, run: Any, worker: _Annotator, metrics: dict, total: int) -> None:
    """An honest outcome: when (nearly) every request failed the run ends `failed`, `latest` stays where it was, and
    the message says what to do. Answers that arrived stay cached, so the resume asks only for what failed."""
    failed = [r for r in worker.records.values() if r.reason == REQUEST_FAILED]
    if not total or len(failed) <= cfg.max_failed_fraction * total:
        return
    last = failed[-1].usage.get("error") or "no answer"
    where = f" at {cfg.base_url}" if cfg.analyzer in HTTP_ANALYZERS else ""
    message = (
        f"{len(failed)} of {total} trajectories got no answer from the {cfg.analyzer} analyzer{where} "
        f"(last: {last}); the run is marked failed and `latest` is unchanged — fix the cause (is the server up, the "
        f"URL and model right?) and continue with `seed annotate --resume {run.path}` "
        f"(more than max_failed_fraction={cfg.max_failed_fraction:g} failed)"
    )
    run.manifest.metrics.update(metrics)
    run.fail(message)
    raise StageFailed(message)


def _drive(worker: _Annotator, pending: list[Job], cfg: AnnotateConfig, stop: threading.Event) -> None:
    """Threaded analyzers: at most `concurrency` requests in flight; an auth error (or Ctrl-C) stops new requests,
    lets the ones in flight land in the cache, and re-raises. Batched analyzers: chunks of `concurrency` prompts."""
    if worker.analyzer is None or getattr(worker.analyzer, "batched", False):
        for i in range(0, len(pending), cfg.concurrency):
            worker.run_batch(pending[i : i + cfg.concurrency])
        return
    pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="annotate")
    futures: set[Future] = {pool.submit(worker.run_one, job) for job in pending}
    try:
        while futures:
            done, futures = wait(futures, return_when=FIRST_COMPLETED)
            for f in done:
                f.result()  # re-raises AuthError / UserError from a worker
    except BaseException:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _metrics(
    cfg: AnnotateConfig,
    model: str,
    worker: _Annotator,
    cache: ResponseCache,
    trajectories: list[Trajectory],
    reused: int,
    pending: int,
    wall: float,
) -> dict[str, Any]:
    records = list(worker.records.values())
    kept = [r for r in records if r.reason is None]
    reasons: dict[str, int] = {}
    for r in records:
        if r.reason is not None:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
    # what this run paid for: its own requests, not answers reused from earlier runs
    own = [e for e in cache.entries.values() if not e.get("reused_from")]
    prompt_tokens = sum(e["prompt_tokens"] for e in own)
    completion_tokens = sum(e["completion_tokens"] for e in own)
    latencies = [e["latency_s"] for e in own]
    cost = 0.0
    if cfg.analyzer in HTTP_ANALYZERS:
        cost = prompt_tokens / 1e6 * cfg.price_prompt_per_mtok + completion_tokens / 1e6 * cfg.price_completion_per_mtok
    wins = [r for r in records if r.won]
    losses = [r for r in records if not r.won]
    p50, p95 = _percentile(latencies, 50), _percentile(latencies, 95)
    metrics: dict[str, Any] = {
        "annotate/trajectories": len(trajectories),
        "annotate/kept": len(kept),
        "annotate/rejected": len(records) - len(kept),
        "annotate/kept_fraction": round(len(kept) / max(len(records), 1), 4),
        **{f"annotate/rejected/{k}": v for k, v in sorted(reasons.items())},
        "annotate/success/trajectories": len(wins),
        "annotate/success/kept": sum(r.reason is None for r in wins),
        "annotate/failure/trajectories": len(losses),
        "annotate/failure/kept": sum(r.reason is None for r in losses),
        "annotate/requests": len(own),
        "annotate/requests_this_session": worker.requests,
        "annotate/reused_responses": reused,
        "annotate/pending_at_start": pending,
        "annotate/schema_retries": sum(r.usage.get("attempts", 1) > 1 and r.reason != REQUEST_FAILED for r in records),
        "annotate/retries": sum(e["retries"] for e in own) + worker.failed_retries,
        "annotate/request_failures": reasons.get(REQUEST_FAILED, 0),
        "usage/prompt_tokens": prompt_tokens,
        "usage/completion_tokens": completion_tokens,
        "timing_s/latency_p50": round(p50, 4) if p50 is not None else None,
        "timing_s/latency_p95": round(p95, 4) if p95 is not None else None,
        "timing_s/annotate": round(wall, 2),
        "cost/usd_estimate": round(cost, 4),
        "analyzer": cfg.analyzer,
        "model": model,
        "prompt_version": ",".join(sorted({r.prompt_version for r in records})) or ANALYSIS_PROMPT_VERSION,
    }
    if cfg.analyzer in HTTP_ANALYZERS:
        metrics["base_url"] = cfg.base_url
        metrics["api_key_env"] = cfg.api_key_env
    return metrics
