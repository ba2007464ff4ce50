"""report.md of one eval run, and the text the other reports share: percentages, category names, metric labels."""

from __future__ import annotations

from seedcli.envs.base import Environment
from seedcli.report.results import env_of

# The paper's baseline rows on the text environments come from SDAR's paper (the authors confirmed it in the official
# repository's issue #2), and the two papers ran ALFWorld with different episode lengths.
SDAR_SHARED_ENVS = ("alfworld", "webshop", "search")
BASELINE_NOTE = (
    "The paper's baseline rows are shared with SDAR's paper (confirmed by the SEED authors in the official "
    "repository's issue #2)."
)
ALFWORLD_STEPS_NOTE = " SDAR runs ALFWorld with 50 steps per episode, SEED with 30."


def type_name(task_type: str, env: Environment | type[Environment]) -> str:
    """Display name of one of the environment's categories."""
    return env.card.category_name(task_type)


def describe_model(results: dict) -> str:
    """One line naming the policy that produced the results."""
    agent = results.get("agent") or {}
    policy = agent.get("policy", "model")
    if policy != "model":
        return f"{policy} policy (no model)" if isinstance(policy, str) else f"mixed policies {policy}"
    model = agent.get("model_id", "unknown model")
    parts = [str(model)]
    if isinstance(agent.get("model_hash"), str):
        parts.append(f"sha {agent['model_hash'][:12]}")
    if isinstance(agent.get("engine"), str):
        parts.append(f"engine {agent['engine']}")
    sampling = agent.get("sampling")
    if isinstance(sampling, dict) and "temperature" in sampling:
        parts.append(f"temperature {sampling['temperature']}")
    return ", ".join(parts)


def pct(x: float | None) -> str:
    """A rate as a percentage ("66.7%"), "—" for none."""
    return "—" if x is None else f"{100 * x:.1f}%"


def _duration(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 60:
        return f"{s:.1f} s"
    h, rem = divmod(int(round(s)), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def num(x: float | None, fmt: str = "{:.1f}") -> str:
    """A number in `fmt`, "—" for none."""
    return "—" if x is None else fmt.format(x)


def partial_line(results: dict) -> str | None:
    """The warning for a result that does not cover the whole split, or None."""
    n, m = results.get("episodes", 0), results.get("expected_games", 0)
    tasks = plural(env_of(results).card.task_noun)
    if results.get("partial"):
        return f"Partial result: {n} of {m} {tasks} (--limit) — not comparable with the paper"
    if m and n < m:
        return f"Incomplete result: {n} of {m} {tasks} were played — not comparable with the paper"
    return None


def plural(noun: str) -> str:
    """'game' → 'games', 'category' → 'categories'."""
    return noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


def marked(label: str, results: dict) -> str:
    """A run's label, with " (partial)" when its result does not cover the whole split."""
    return f"{label} (partial)" if partial_line(results) else label


def metric_text(results: dict, key: str) -> str:
    """A results.json metric as reports show it: success as a percentage, a score ×100 ("88.5")."""
    v = results.get(key)
    return pct(v) if "success" in key else num(None if v is None else 100 * v)


def metric_label(key: str, env: type[Environment]) -> str:
    """The environment's name for a results.json metric ("macro success", "exact match (all questions)")."""
    return env.card.metric_labels.get(key) or key.replace("_", " ")


def render_report(results: dict, *, title: str, model_desc: str, run_id: str) -> str:
    """report.md of one eval run: per-category table, our headline metrics beside the paper's, episode statistics."""
    env = env_of(results)
    split = results["split"]
    lines = [f"# {title}", ""]
    lines.append(
        f"- Environment: {env.title}; split: {split} ({results.get('episodes', 0)} of "
        f"{results.get('expected_games', '?')} {plural(env.card.task_noun)})"
    )
    lines.append(f"- Model: {model_desc}")
    lines += setup_lines(results)
    lines.append(f"- Run: {run_id}")
    warn = partial_line(results)
    if warn:
        lines += ["", f"> **{warn}.**"]
    lines += _category_table(results, env)
    lines += _paper_section(results, env, partial=bool(warn))
    lines += _episode_section(results)
    return "\n".join(lines)


def _category_table(results: dict, env: type[Environment]) -> list[str]:
    """report.md's table: a row per category the run played, the macro and micro averages (the environment's
    headline in bold), and a line on what they mean."""
    cats = results["categories"]
    with_score = any(k.endswith("_score") for k in env.card.metric_labels)
    # an environment that reports no success (search: exact match) shows its score alone, under its own name
    with_success = any(k.endswith("_success") for k in env.card.metric_labels)
    score_name = "Score" if with_success else metric_label(next(iter(env.card.metric_labels)), env).split(" (")[0]
    score_name = score_name[:1].upper() + score_name[1:]
    noun = env.card.category_label
    score_head, score_rule = (f" {score_name} |", "--:|") if with_score else ("", "")
    success_head, success_rule = (" Success |", "--:|") if with_success or not with_score else ("", "")
    heading = "Success" if with_success or not with_score else score_name
    if with_score and with_success:
        heading = f"{score_name} and success"  # WebShop: the score is the headline, success beside it
    headline = next(iter(env.card.metric_labels))

    def cell(key: str, text: str) -> str:
        return f" **{text}** |" if key == headline else f" {text} |"

    lines = [
        "",
        f"## {heading} by {noun}",
        "",
        f"| {noun.capitalize()} | {plural(env.card.task_noun).capitalize()} | Wins |{success_head}{score_head}",
        f"|---|--:|--:|{success_rule}{score_rule}",
    ]
    for t, row in cats.items():
        if not row["games"]:  # a category this run had no tasks of (a partial run, --categories, another split)
            continue
        score = f" {num(None if row.get('mean_score') is None else 100 * row['mean_score'])} |" if with_score else ""
        success = f" {pct(row['success_rate'])} |" if success_head else ""
        lines.append(f"| {type_name(t, env)} | {row['games']} | {row['wins']} |{success}{score}")
    # the environment's headline in bold: ALFWorld macro success, WebShop score (all goals), search the average
    macro_score = cell("macro_score", metric_text(results, "macro_score")) if with_score else ""
    micro_score = cell("mean_score", metric_text(results, "mean_score")) if with_score else ""
    macro_success = cell("macro_success", pct(results["macro_success"])) if success_head else ""
    micro_success = cell("micro_success", pct(results.get("micro_success"))) if success_head else ""
    macro_name, micro_name = (
        ("**Macro average**", "Micro average")
        if headline.startswith("macro")
        else ("Macro average", "**Micro average**")
    )
    lines.append(f"| {macro_name} | | |{macro_success}{macro_score}")
    lines.append(
        f"| {micro_name} | {results.get('episodes', 0)} | {results.get('wins', '—')} |{micro_success}{micro_score}"
    )
    lines += [
        "",
        f"Macro = mean over the {results.get('macro_types', '?')} {plural(noun)} that had {plural(env.card.task_noun)}; "
        f"micro = all {plural(env.card.task_noun)} pooled"
        + (f"; {score_name.lower()} = mean reward in [0, 100]" if with_score else "")
        + f". Headline: {metric_label(headline, env)}.",
    ]
    return lines


def _paper_section(results: dict, env: type[Environment], *, partial: bool) -> list[str]:
    """report.md's paper section: this run's headline metrics beside the paper's, and the notes on them; none for an
    environment the paper did not run (no numbers on its card: a plug-in, an adapter), only its card's note."""
    offline = env.card.offline_note and not _options(results).get("search_url")
    if not env.card.paper_results:
        return ["", env.card.offline_note] if offline else []
    split = results["split"]
    paper = env.card.paper_results.get(split)
    lines = ["", f"## Paper ({env.card.paper_model}, docs/design.md §1)", ""]
    if paper:
        keys = [k for k in env.card.metric_labels if any(k in row for row in paper.values())]
        lines += [
            "| Method | " + " | ".join(f"{metric_label(k, env).capitalize()} ({split})" for k in keys) + " |",
            "|---|" + "--:|" * len(keys),
        ]
        mine = " | ".join(f"**{metric_text(results, k)}**" for k in keys)
        lines.append(f"| **This run**{' (partial)' if partial else ''} | {mine} |")
        for method, row in paper.items():
            cells = " | ".join(metric_text(row, k) if k in row else "—" for k in keys)
            lines.append(f"| {method} (paper) | {cells} |")
        lines += ["", env.card.paper_note]
        if env.name in SDAR_SHARED_ENVS and any(method != "SEED" for method in paper):
            lines += ["", BASELINE_NOTE + (ALFWORLD_STEPS_NOTE if env.name == "alfworld" else "")]
    else:
        known = ", ".join(env.card.paper_results) or "none"
        lines.append(f"The paper reports no {env.title} numbers for split `{split}` (only {known}).")
    if offline:
        lines += ["", env.card.offline_note]  # it speaks of the offline corpus, which a search_url run did not use
    return lines


def _episode_section(results: dict) -> list[str]:
    """report.md's episode statistics: length, reward, counted actions, invalid actions, tokens, wall time."""
    invalid = results.get("invalid_turns")
    turns = results.get("turns")
    counts = f" ({invalid} of {turns} turns)" if invalid is not None and turns is not None else ""
    return [
        "",
        "## Episodes",
        "",
        f"- Mean episode length: {num(results.get('mean_episode_length'))} steps",
        *([f"- Mean episode reward: {num(results['mean_reward'], '{:.2f}')}"] if "mean_reward" in results else []),
        *(f"- Mean {label} per episode: {num(v, '{:.2f}')}" for label, v in results.get("per_episode", {}).items()),
        f"- Invalid-action rate: {pct(results.get('invalid_action_rate'))}{counts}",
        f"- Tokens generated: {results.get('tokens_generated', 0):,}",
        f"- Wall time: {_duration(results.get('wall_time_s'))}",
        "",
    ]


def _options(results: dict) -> dict:
    setup = results.get("setup")
    options = setup.get("env_options") if isinstance(setup, dict) else None
    return options if isinstance(options, dict) else {}


def setup_lines(results: dict) -> list[str]:
    """Report lines on what the numbers depend on beyond the model: the retriever (search), env options, data."""
    setup = results.get("setup")
    if not isinstance(setup, dict):
        return []  # results written before seedcli recorded it
    options = _options(results)
    lines = []
    if options.get("search_url"):
        lines.append(
            f"- Retriever: {options['search_url']} (`env_options.search_url`, a Search-R1 /retrieve server); "
            "whether it serves wiki-18's 21M passages, as the paper's does, is up to that server"
        )
    elif env_of(results).name == "search":
        corpus = options.get("corpus") or (f"{setup['data_root']}/corpus.jsonl" if setup.get("data_root") else "?")
        lines.append(f"- Retriever: in-process BM25 over {corpus}")
    shown = {k: v for k, v in options.items() if k not in ("search_url", "corpus")}
    if shown:
        lines.append("- Environment options: " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())))
    if setup.get("data_root"):
        lines.append(f"- Data: {setup['data_root']}")
    return lines
