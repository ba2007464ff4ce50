"""The environment protocol: everything a stage may know about an environment (docs/design.md §2).

An environment is a subclass of `Environment` registered by name in `seedcli/envs/__init__.py`. Stages, the rollout
loop, rescoring, annotate, sft, rl, eval and reporting use only what is declared here; nothing outside
`seedcli/envs/` imports an environment's own module. Environments never import torch.

What an environment supplies (class attributes are constants; methods have a default where one fits most envs):

    data        `resolve_data_root()` (explicit path, $<ENV>_DATA, or ../shared/<env>; UserError when missing)
    tasks       `splits`, `list_tasks(split)` -> [Task] (stable `task_id`, `category`, `split`),
                `select_tasks(tasks, n, seed, categories)` (seeded, category-balanced; the default fits)
    playing     `new_game(expert)` -> EnvGame (reset(task) / step(action) -> StepResult; run in worker
                processes by `seedcli.envs.pool.EnvPool`), `spec()` (what a worker needs to rebuild the env)
    prompt      `prompt_version`, `render_prompt(...)`, `task_line_prefix` (the skill block goes right after the
                line holding it: `insert_skill`; a step skill before the "Now it's your turn" line:
                `insert_step_skill`), `max_steps`, `history`, `max_step_skills`
    actions     `parse_action(response)` -> (action sent to the game, valid), `format_response(think, action)`
    reward      `success_reward` (episode reward = success_reward·won), `invalid_penalty` per invalid turn,
                `advantage_norm` ("mean_std" or "mean": how GRPO normalises a group's turn scores), `gigpo_norm`
                and `gigpo_similarity_threshold` (GiGPO's mode and similarity grouping in verl-agent's launchers)
    analysis    `analysis_description` (first sentence of the analysis prompt), `rules_skill(trajectory)`,
                `hindsight_skill(trajectory)` (`--analyzer hindsight`: the episode replayed against the expert),
                `leaks(trajectory, skill)` (spans of the skill that leak this episode's hindsight facts),
                `oracle_skill(trajectory)` (the privileged text of `--analyzer oracle`: the expert's plan by default)
    policies    `expert_response(result)`, `random_response(result, rng)`
    eval        `categories`, `eval_splits`, `limit_per_category`, `counted_actions`, `reports_reward`
    tokenizer   `sample_texts()`, `template_texts()`: text the tiny models' tokenizer is trained on
    skills      `canonical_category(name)`: the category a static skill library's key names (aliases allowed)
    card        `card` (`seedcli.envs.card.EnvCard`): what reports say about it — metric labels (results.json keys,
                headline first), category display names, what a task and a category are called, the paper's
                numbers and notes

Each environment's package has the same files (tests/unit/test_layout.py checks them): `env.py` (the Environment
subclass), `game.py` and/or `data.py` (the simulator, the dataset), `episode.py` (its EnvGame), `prompt.py` (templates,
the turn prompt, tokenizer text), `projection.py` (reply -> action and validity), `reward.py` (what the trainer's
reward is made of, and the leak rule), `rules.py` (the offline rules analyzer) and `expert.py`.

Environment instances are cheap to make: data is read lazily (in `list_tasks` / `new_game`), so a stage can ask
`get_env(name).parse_action(...)` without any data installed.
"""

from __future__ import annotations

import io
import os
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from seedcli.envs.card import EnvCard
from seedcli.envs.hindsight import Replayed, generic_skill, replay
from seedcli.errors import UserError
from seedcli.prompts import ORACLE_PREFIX, insert_after_line, insert_step_skill

REPO_ROOT = Path(__file__).resolve().parents[2]
# the longest turn limit (`max_steps`) an environment or a run may set: an episode that never ends shows no progress
# until it does, so a limit far above any game's is refused rather than played for hours (docs/environments.md)
MAX_STEPS = 1000


def find_data_root(
    explicit: str | os.PathLike | None,
    env_var: str,
    shared_name: str,
    has_data: Callable[[Path], bool],
    missing: Callable[[str, Path | None], str],
) -> Path:
    """An environment's data folder: `explicit`, else $`env_var`, else ../shared/`shared_name` next to the working
    directory or the repository. A folder `has_data` rejects (or none found) is a UserError whose one line is
    `missing(source, folder)`, source being "explicit", "env" or "default" (folder None: no default found)."""
    root: Path | None
    if explicit is not None and str(explicit) != "":
        root, source = Path(explicit).expanduser(), "explicit"
    elif os.environ.get(env_var):
        root, source = Path(os.environ[env_var]).expanduser(), "env"
    else:
        candidates = [Path.cwd().parent / "shared" / shared_name, REPO_ROOT.parent / "shared" / shared_name]
        root, source = next((c for c in candidates if has_data(c)), None), "default"
    if root is None or not has_data(root):
        raise UserError(missing(source, root))
    return root.resolve()


# YAML 1.1 reads these words as booleans (`leak_guard=off` is False), so a field whose options include one of them
# takes the boolean back as that word
YAML_BOOL_WORDS = {True: ("on", "yes", "true"), False: ("off", "no", "false")}


def yaml_words(model: type[BaseModel], data: Any) -> Any:
    """`data` (a mapping of field values) with every boolean given to a field whose options are words (a `Literal`)
    turned back into the option YAML read as that boolean (`off`, `no`, `on`, `yes`, ...), when the field has exactly
    one such option; anything else is left for validation to judge."""
    if not isinstance(data, dict):
        return data
    out = None
    for name, value in data.items():
        field_info = model.model_fields.get(str(name))
        if not isinstance(value, bool) or field_info is None:
            continue
        words = [w for w in literal_words(field_info.annotation) if w.lower() in YAML_BOOL_WORDS[value]]
        if len(words) == 1:
            out = out if out is not None else dict(data)
            out[name] = words[0]
    return out if out is not None else data


def literal_words(annotation: Any) -> list[str]:
    """The string options of a `Literal[...]` annotation, also inside `X | None`; [] for any other type."""
    if get_origin(annotation) is Literal:
        return [a for a in get_args(annotation) if isinstance(a, str)]
    return [w for arg in get_args(annotation) if arg is not type(None) for w in literal_words(arg)]


class EnvOptions(BaseModel):
    """An environment's options (`env_options`), declared once: one typed field per option, with its range, default
    and meaning (`Field(description=...)`). The stages check a config's options against it before anything runs,
    the environment checks them again when it is built, and `seed envs` lists them. This base declares none, so an
    environment that does not subclass it refuses every option."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a float option is finite (as stage configs')

    @model_validator(mode="before")
    @classmethod
    def _yaml_words(cls, data: Any) -> Any:  # `{observation: off}`-style words YAML read as booleans
        return yaml_words(cls, data)


@dataclass(frozen=True)
class Task:
    """One playable task: an ALFWorld game, a WebShop goal, a search question.

    `task_id` is stable across machines and runs (it names the task in records and resumes); `category` is the
    unit of balanced selection and per-category metrics (ALFWorld task type, WebShop product category, search
    data source). Must pickle: the pool sends it to worker processes."""

    task_id: str
    category: str
    split: str
    name: str = ""  # human-readable label for progress and error messages (default: task_id)

    @property
    def label(self) -> str:
        return self.name or self.task_id


@dataclass
class StepResult:
    """What the agent sees after a reset or a step (also what the pool sends back from a worker)."""

    observation: str
    admissible: list[str] | None  # actions the agent may choose from; None: free-text actions (search)
    won: bool  # the episode is a success (ALFWorld: goal reached; WebShop: bought reward 1.0; search: exact match)
    done: bool  # the episode is over (won, bought, answered); the step limit is the caller's
    task: str  # the task text shown on the task line
    expert_action: str | None = None  # next action of the expert (expert games only; None once done)
    reward: float = 0.0  # the environment's raw reward of this step (WebShop: purchase reward in [0, 1])
    score: float = 0.0  # the episode's score in [0, 1] so far; final when done (ALFWorld: won)
    info: dict[str, Any] = field(default_factory=dict)  # env-specific extras, JSON-serialisable
    image: bytes | None = None  # the observation as a PNG (image observation mode of a visual environment)


class EnvGame(Protocol):
    """One episode slot: a game played in this process (the pool holds one per slot, in a worker)."""

    def reset(self, task: Task) -> StepResult: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


class Environment(ABC):
    """Base class of every environment; see the module docstring for what a subclass supplies."""

    name: ClassVar[str]  # registry name (`seedcli.envs.ENV_NAMES`): alfworld, webshop, search, sokoban, ezpoints
    title: ClassVar[str]  # display name in reports and messages: "ALFWorld"
    prompt_version: ClassVar[str]  # bump whenever render_prompt's text changes
    task_line_prefix: ClassVar[str]  # the skill block goes after the line that holds this text
    max_steps: ClassVar[int]  # default turns per episode
    history: ClassVar[int]  # default observation/action pairs shown
    success_reward: ClassVar[float] = 10.0
    invalid_penalty: ClassVar[float] = 0.1
    advantage_norm: ClassVar[Literal["mean_std", "mean"]] = "mean_std"
    # GiGPO (rl step_advantage gigpo): verl-agent's examples/gigpo_trainer/run_<env>.sh mode and similarity_thresh
    gigpo_norm: ClassVar[Literal["mean_std", "mean"]] = "mean_std"
    gigpo_similarity_threshold: ClassVar[float | None] = None  # None: step groups of identical observations only
    max_step_skills: ClassVar[int] = 5  # rl's default cap on step skills per episode (the SEED code's launchers)
    free_text: ClassVar[bool] = False  # True: StepResult.admissible is None and actions are free text
    splits: ClassVar[dict[str, str]]  # accepted split name or alias -> canonical split name
    train_split: ClassVar[str] = "train"
    eval_splits: ClassVar[tuple[str, ...]]  # canonical splits eval accepts; the first is the default
    val_split: ClassVar[str]  # canonical split rl validates on
    categories: ClassVar[tuple[str, ...]]  # known categories in report order ((): discovered from the tasks)
    category_aliases: ClassVar[dict[str, str]] = {}  # other names a static skill library may use -> category
    analysis_description: ClassVar[str]  # first sentence of the analysis prompt: who the analyst is, what it reads
    rules_version: ClassVar[str] = "rules-v1"  # version of rules_skill's text (annotate's cache key); bump on change
    hindsight_version: ClassVar[str] = "hindsight-v1"  # version of hindsight_skill's text (annotate's cache key)
    limit_per_category: ClassVar[bool] = False  # `seed eval --limit N`: N per category (True) or N in all, balanced
    counted_actions: ClassVar[dict[str, str]] = {}  # label -> action prefix; eval reports their mean per episode
    expert_modes: ClassVar[tuple[Any, ...]] = (False, True)
    observation_modes: ClassVar[tuple[str, ...]] = ("text",)  # what the agent sees: text, or images too (visual)
    reports_reward: ClassVar[bool] = False  # eval reports the mean episode return (the sum of StepResult.reward)
    split_file: ClassVar[str] = ""  # what a split given as a file path holds ("": only the named splits)
    options_model: ClassVar[type[EnvOptions]] = EnvOptions  # the `env_options` this environment takes
    card: ClassVar[EnvCard]  # what reports say about it (seedcli.envs.card)

    def __init__(self, data_root: str | None = None, **options: Any):
        self.data_root = data_root
        self.options = self.check_options(options)

    @classmethod
    def check_options(cls, options: dict[str, Any] | None) -> dict[str, Any]:
        """`options` checked against `options_model` (type, range, known name) and normalised: the options given,
        None dropped. A bad one is a one-line UserError naming the option, the value and what is wanted."""
        model = cls.options_model
        # a name nobody knows is refused even without a value (`{topk:0}` is YAML for {"topk:0": null})
        given = {str(k): v for k, v in (options or {}).items() if v is not None or str(k) not in model.model_fields}
        known = list(model.model_fields)
        takes = (
            f"{cls.title} takes {', '.join(known)}; `seed envs` describes them"
            if known
            else (f"{cls.title} takes no env options")
        )
        try:
            checked = model.model_validate(given)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(x) for x in err["loc"]) or "?"
            if err["type"] == "extra_forbidden":
                close = get_close_matches(key, known, n=1, cutoff=0.5)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise UserError(f"unknown {cls.title} option '{key}' in env_options{hint} ({takes})") from None
            value = given.get(str(err["loc"][0])) if err["loc"] else given
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise UserError(
                f"{cls.title} env option {key}={value!r}: {msg[:1].lower()}{msg[1:]} (`seed envs` describes {cls.name}'s "
                "options)"
            ) from None
        return checked.model_dump(exclude_unset=True, exclude_none=True)

    @classmethod
    def option_specs(cls) -> list[tuple[str, str, Any, str]]:
        """(name, type, default, meaning) of every option, in declaration order (for `seed envs` and help)."""
        out = []
        for name, spec in cls.options_model.model_fields.items():
            annotation = spec.annotation
            text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
            text = text or str(annotation).replace("typing.", "").replace("NoneType", "None")
            default = spec.get_default(call_default_factory=True)
            out.append((name, text, default, spec.description or ""))
        return out

    # -- tasks --------------------------------------------------------------------------------------------------

    def spec(self) -> dict[str, Any]:
        """Keyword arguments that rebuild this environment in a worker process (JSON-serialisable)."""
        return {"data_root": None if self.data_root is None else str(self.data_root), **self.options}

    def frame_size(self) -> tuple[int, int] | None:
        """(height, width) of the observation images this environment shows the agent, in pixels; None when it shows
        none (text observations). A vision-language engine sizes its memory and image bounds by it."""
        return None

    def resolve_data_root(self) -> Path:
        """The data folder this environment reads (explicit `data_root`, its environment variable, or
        ../shared/<env>); missing data is a one-line UserError saying how to get it."""
        raise NotImplementedError(f"{self.name}: resolve_data_root")

    def resolve_split(self, split: str) -> str:
        """The canonical name of a split or alias; an unknown one is a UserError."""
        canon = self.splits.get(str(split).strip().lower())
        if canon is None:
            raise UserError(f"unknown {self.title} split {split!r}: use one of {', '.join(self.splits)}")
        return canon

    @abstractmethod
    def list_tasks(self, split: str) -> list[Task]:
        """Every task of a split in a stable order; missing data is a one-line UserError."""

    def select_tasks(
        self, tasks: Sequence[Task], n: int, seed: int, categories: Sequence[str] | None = None
    ) -> list[Task]:
        """Up to `n` tasks balanced over categories, deterministic in `seed` (see `select_balanced`)."""
        if categories is not None and self.categories:
            known = set(self.categories)
            unknown = [c for c in categories if c not in known]
            if unknown:
                raise UserError(
                    f"unknown {self.title} categor{'y' if len(unknown) == 1 else 'ies'} "
                    f"{', '.join(map(repr, unknown))}: use any of {', '.join(self.categories)}"
                )
        order = list(self.categories) or sorted({t.category for t in tasks})
        extra = sorted({t.category for t in tasks} - set(order))
        return select_balanced(tasks, n, seed, [*order, *extra], categories)

    def canonical_category(self, name: str) -> str | None:
        """The category a user-written name means (static skill libraries), or None."""
        key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
        for c in self.categories:
            if key == c.lower():
                return c
        return self.category_aliases.get(key)

    # -- playing ------------------------------------------------------------------------------------------------

    @abstractmethod
    def new_game(self, expert: bool | str = False) -> EnvGame:
        """A fresh episode slot; `expert` makes its StepResults carry `expert_action`."""

    # -- prompt and actions ---------------------------------------------------------------------------------------

    @abstractmethod
    def render_prompt(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str] | None,
        step: int,
        history: Sequence[tuple[str, str]],
        history_length: int,
    ) -> str:
        """The user message of one turn. `step` counts from 1; `history` holds (observation, action) pairs of all
        earlier turns, of which the last `history_length` are shown."""

    def insert_skill(self, prompt: str, skill: str) -> str:
        """The skill-augmented prompt: the skill block right after the task line (docs/design.md §1, stage 2 step 3)."""
        return insert_after_line(prompt, self.task_line_prefix, skill)

    def insert_step_skill(self, prompt: str, skill: str) -> str:
        """The step-skill-augmented prompt (`seed rl --skill_mode episode_step | step_only`): the step-skill block
        before the line that asks for this turn's answer, as the SEED code places its critical-step skill."""
        return insert_step_skill(prompt, skill)

    @abstractmethod
    def parse_action(self, response: str) -> tuple[str, bool]:
        """(action sent to the game, valid) of a response; an invalid turn still sends its action."""

    def format_response(self, think: str, action: str) -> str:
        """A well-formed response that `parse_action` reads back as `action` (expert, random, warm start, tests)."""
        return f"<think>{think}</think>\n<action>{action}</action>"

    def demo_thought(self, trajectory, turn, action: str) -> str | None:
        """The thought of a warm-start demonstration turn that plays `action` (the expert's) at `turn`: reasoning a
        policy can learn to reproduce from what the prompt shows; None = the warm start's constant thought."""
        return None

    def expert_response(self, result: StepResult) -> str:
        """The expert's response to `result` (from an expert game)."""
        return self.format_response("I follow the expert plan.", result.expert_action or "")

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        """A random valid response: the floor."""
        choices = list(result.admissible or [])
        if not choices:
            raise NotImplementedError(f"{self.name}: free-text environments must define random_response")
        return self.format_response("I pick a random admissible action.", rng.choice(choices))

    # -- analysis -------------------------------------------------------------------------------------------------

    @abstractmethod
    def rules_skill(self, trajectory) -> tuple[str, str]:
        """(episode_summary, episode_skill) the offline rules analyzer writes for one Trajectory."""

    def leaks(self, trajectory, skill: str) -> list[tuple[int, int]]:
        """The (start, end) character spans of `skill` that leak what only hindsight on `trajectory` knows (the
        answer, the goal product, where the target was, the moves); empty when none. The default finds none."""
        return []

    def hindsight_replay(self, trajectory, probe: Callable[[Any, StepResult], Any] | None = None) -> list[Replayed]:
        """The episode's actions played again in an expert game of its task (`envs/hindsight.py: replay`), each turn
        with the expert's action in the state it saw; `probe(game, result)` reads more off the game at each state.
        A UserError when the environment has no expert; ReplayMismatch when the replay is not the episode."""
        if True not in self.expert_modes:
            raise UserError(
                f"{self.title} has no expert: --analyzer hindsight replays each episode against it; use --analyzer rules"
            )
        task = Task(trajectory.task_id, trajectory.category, trajectory.split)
        actions = [t.action for t in trajectory.turns]
        return replay(self.new_game(expert=True), task, actions, trajectory.won, probe)

    def hindsight_skill(self, trajectory) -> tuple[str, str]:
        """(episode_summary, episode_skill) of `--analyzer hindsight`, the offline stand-in for GLM: the turn that won
        the episode, or the one where it left the expert's path, what the expert did there and a rule
        (`envs/hindsight.py`; an environment phrases its own in `envs/<env>/hindsight.py`)."""
        return generic_skill(self.title, trajectory, self.hindsight_replay(trajectory))

    # -- privileged information (`--analyzer oracle`) ------------------------------------------------------------

    def expert_plan(self, task: Task, limit: int = 100) -> list[tuple[str, StepResult]]:
        """The expert's actions on `task` from its start, each with the result it led to: an expert game played in
        this process, at most `limit` steps; [] when the expert offers no action."""
        game = self.new_game(expert=True)
        try:
            result = game.reset(task)
            plan: list[tuple[str, StepResult]] = []
            while not result.done and result.expert_action and len(plan) < limit:
                action = result.expert_action
                result = game.step(action)
                plan.append((action, result))
            return plan
        finally:
            game.close()

    def no_expert(self) -> str:
        """Why this environment (with its options) has no expert to play or to plan from ("" when it has one)."""
        return "" if True in self.expert_modes else f"{self.title} has no expert"

    def oracle_skill(self, trajectory) -> str | None:
        """The privileged text `--analyzer oracle` gives the teacher for this episode's task: what the expert knows
        before playing (by default its plan, the actions that solve the task from the start), not a hindsight skill
        (it is the same whatever the episode did); None when the expert has no plan. Cached per task."""
        key = (trajectory.task_id, trajectory.split)
        cache = self.__dict__.setdefault("_oracle_cache", {})
        if key not in cache:
            plan = self.expert_plan(Task(trajectory.task_id, trajectory.category, trajectory.split))
            steps = "; ".join(f"{i}. {action}" for i, (action, _) in enumerate(plan, 1))
            cache[key] = f"{ORACLE_PREFIX}the expert's plan for this task: {steps}." if plan else None
        return cache[key]

    # -- tokenizer ------------------------------------------------------------------------------------------------

    def sample_texts(self) -> list[str]:
        """Text for the tiny tokenizer: prompts and observations as this env renders them. May read data; an env
        without data returns its templates only."""
        return []

    def template_texts(self) -> list[str]:
        """Rendered prompt templates the tiny tokenizer also learns (after every environment's `sample_texts`), so
        prompt boilerplate compresses to few tokens; reads no data."""
        return []


def select_balanced(
    tasks: Sequence[Task],
    n: int,
    seed: int,
    order: Sequence[str],
    categories: Sequence[str] | None = None,
) -> list[Task]:
    """Up to `n` tasks balanced over categories (n=180 over six -> 30 each), deterministic in `seed`.

    Within a category the tasks are shuffled by the seed; the result interleaves categories round-robin in `order`,
    so every prefix is balanced too. A category with too few tasks gives all it has and the others fill in."""
    if n < 0:
        raise UserError(f"number of tasks must be >= 0, got {n}")
    wanted = [c for c in order if categories is None or c in categories]
    by_cat: dict[str, list[Task]] = {c: [] for c in wanted}
    for t in sorted(tasks, key=lambda t: (t.name, t.split, t.task_id)):
        if t.category in by_cat:
            by_cat[t.category].append(t)
    for c, pool in by_cat.items():
        random.Random(f"{seed}/{c}").shuffle(pool)
    cats = [c for c in wanted if by_cat[c]]

    # Water-filling: equal quotas (remainder to the first categories in order), capped by what a category has.
    quota = {c: 0 for c in cats}
    left = min(n, sum(len(by_cat[c]) for c in cats))
    while left > 0:
        open_cats = [c for c in cats if quota[c] < len(by_cat[c])]
        share, extra = divmod(left, len(open_cats))
        for i, c in enumerate(open_cats):
            take = min(share + (1 if i < extra else 0), len(by_cat[c]) - quota[c])
            quota[c] += take
            left -= take

    chosen = {c: by_cat[c][: quota[c]] for c in cats}
    out: list[Task] = []
    for r in range(max(quota.values(), default=0)):
        out.extend(chosen[c][r] for c in cats if r < len(chosen[c]))
    return out


def encode_png(pixels) -> bytes:
    """A uint8 H×W×3 array as PNG bytes (deterministic: the same pixels give the same bytes, so the sha256 names
    the image)."""
    from PIL import Image  # lazy: only the visual environments draw images

    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def merge_spans(spans) -> list[tuple[int, int]]:
    """Character spans sorted, with overlapping or touching ones merged (the leak rules' answer)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
