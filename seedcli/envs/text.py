"""`TextEnv`: a text environment in a few lines. Write a gymnasium-style class; the rest of the protocol
(`seedcli.envs.base.Environment`) gets a documented default. docs/environments.md has a complete example.

    from seedcli.envs import TextEnv

    class Guess(TextEnv):
        def tasks(self, split):            # the tasks of a split, the same list on every call
            ...
        def reset(self, task):             # start `task`; return the first observation
            ...
        def step(self, action):            # play `action`; return (observation, reward, done)
            ...

A task is what `tasks` returns: a string, a number, or a dict (its "id" names it, its "category" groups it; without an
"id" a dict is named by its position). One instance of the class plays one episode at a time: `new_game` makes a
fresh instance per episode slot (`type(self)(data_root, **options)`), in the worker process that hosts the slot.

Optional, each with its default:

    expert(self) -> str | None         the expert's next action in the current state (none: no expert; `seed collect
                                       --policy expert`, the warm start and `--analyzer oracle`'s plan need one)
    admissible(self) -> list | None    the actions the prompt lists in the current state (None: free text)
    task_text(self, task) -> str       the task line: the task when it is text, a dict's "task" or "question", else
                                       the class docstring's first line
    is_won(self, episode_return, done) the episode is won when it ended with a positive return (sum of rewards)
    rules_skill(self, trajectory)      `--analyzer rules`: a generic rule from the outcome (`generic_rules_skill`)
    leaks(self, trajectory, skill)     the spans of a skill that leak hindsight facts (none)
    oracle_skill(self, trajectory)     `--analyzer oracle`: the expert's plan from the task's start (base default)
    close(self)                        release what reset opened

Class attributes a subclass may set: `title` (the class name), `instructions` (a paragraph the prompt shows under its
first line: the rules, the action format), `max_steps` 10 (at most `MAX_STEPS`, 1000), `history` 3, `splits` (train and test), `eval_splits`,
`val_split`, `image_size` (image observations, below), and the reward convention of docs/design.md §1:
`success_reward` 10 · won − `invalid_penalty` 0.1 per invalid reply, normalised over a group (`advantage_norm`).
An observation may be an `Observation(text, image)`: with `image_size = (height, width)` set, every observation
carries an image (PNG bytes or an H×W×3 uint8 array) and the prompt shows it where `<image>` stands.

The prompt (`render_prompt`) is the title line, the instructions, `Your task: …` (the skill block goes after the
task: `insert_skill`), the last `history` observations with the actions taken, the current observation, the
admissible actions when there are any, and "Now it's your turn": think inside <think> </think>, act inside <action>
</action>. A reply without both is invalid (`parse_action`); its text is still sent. Reports show success (headline)
and score (the return, clipped to [0, 1]).

Every call into the class is checked where it is made (`TextGame`, the socket): an exception, a step that is not
(observation, reward, done[, info]), a reward that is not a finite number, an observation that is not a str (bytes,
a lone surrogate), or a split with no tasks is one line naming the class, the method, the task and the step
(`EnvFault`, exit 2; the traceback goes to the run's log). A plug-in plays one step before a stage loads a model
(`check_plays`).
"""

from __future__ import annotations

import inspect
import math
import numbers
import random
import re
import traceback
from abc import abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from seedcli.envs.base import Environment, StepResult, Task, encode_png
from seedcli.envs.card import EnvCard
from seedcli.errors import EnvFault, UserError
from seedcli.prompts import IMAGE_PLACEHOLDER, insert_after_line

TASK_LINE = "Your task: "
TURN_LINE = (
    "Now it's your turn: reason step by step inside <think> </think>, then write your {tag} inside <{tag}> </{tag}>."
)
DEFAULT_CATEGORY = "all"
DOCS_FAULTS = "docs/environments.md#when-it-breaks-the-protocol"


@dataclass(frozen=True)
class Observation:
    """What `reset` or `step` may return instead of a string: the text and an image (PNG bytes or an H×W×3 uint8
    array), for an environment that sets `image_size`."""

    text: str
    image: Any = None


class TextEnv(Environment):
    """Base class of a text environment written as a gymnasium-style class (see the module docstring)."""

    title: ClassVar[str] = ""  # default: the class name
    instructions: ClassVar[str] = ""  # shown under the prompt's first line: the rules, the action format
    action_tag: ClassVar[str] = "action"  # the reply's action goes inside <action> </action>
    prompt_version = "text-v1"
    task_line_prefix = TASK_LINE
    max_steps = 10
    history = 3
    free_text = True
    splits: ClassVar[dict[str, str]] = {"train": "train", "test": "test", "eval": "test", "valid": "test"}
    eval_splits: ClassVar[tuple[str, ...]] = ("test",)
    val_split = "test"
    categories: ClassVar[tuple[str, ...]] = ()  # found from the tasks
    analysis_description: ClassVar[str] = ""  # default: written from the title
    rules_version = "text-rules-v1"
    reports_reward = True
    image_size: ClassVar[tuple[int, int] | None] = None  # (height, width): every observation carries an image
    card: ClassVar[EnvCard] = EnvCard(metric_labels={"micro_success": "success", "mean_score": "score"})

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "title", ""):
            cls.title = cls.__name__
        if not getattr(cls, "name", ""):
            cls.name = cls.__name__.lower()
        if not getattr(cls, "analysis_description", ""):
            cls.analysis_description = (
                f"You are an expert analyst of agents playing {cls.title} (a text environment: the agent reads the "
                "task and each observation and writes one action a turn)."
            )
        cls.expert_modes = (False, True) if cls.expert is not TextEnv.expert else (False,)
        if cls.image_size is not None:
            cls.observation_modes = ("image",)

    # -- what a subclass writes ----------------------------------------------------------------------------------

    @abstractmethod
    def tasks(self, split: str) -> Sequence[Any]:
        """The tasks of a canonical split (a string, a number or a dict each), the same list on every call."""

    @abstractmethod
    def reset(self, task: Any) -> str | Observation:
        """Start `task` (an item of `tasks`); return the first observation."""

    @abstractmethod
    def step(self, action: str) -> tuple:
        """Play `action`; return (observation, reward, done), or (observation, reward, done, info); `info={"invalid":
        True}` marks a move the game refused (the turn counts as invalid: the penalty, the invalid-action rate)."""

    def expert(self) -> str | None:
        """The expert's next action in the current state (override to give the environment an expert)."""
        return None

    def admissible(self) -> list[str] | None:
        """The actions the prompt lists in the current state; None: free text."""
        return None

    def task_text(self, task: Any) -> str:
        """The task line of `task` (see the module docstring)."""
        if isinstance(task, str):
            return task
        if isinstance(task, dict) and isinstance(task.get("task") or task.get("question"), str):
            return task.get("task") or task["question"]
        doc = inspect.getdoc(type(self)) or ""
        return doc.split("\n\n")[0].replace("\n", " ").strip() or f"play {self.title}"

    def is_won(self, episode_return: float, done: bool) -> bool:
        """The episode is a success: by default, it ended with a positive return."""
        return bool(done and episode_return > 0)

    def close(self) -> None:
        """Release what `reset` opened (nothing by default)."""

    # -- tasks ---------------------------------------------------------------------------------------------------

    def resolve_data_root(self) -> Path:
        """The `data_root` given, else the folder of the module that defines the class (its tasks are its own)."""
        if self.data_root:
            return Path(self.data_root).expanduser().resolve()
        return Path(inspect.getfile(type(self))).resolve().parent

    def list_tasks(self, split: str) -> list[Task]:
        split = self.resolve_split(split)
        return [task for task, _ in self._tasks(split).values()]

    def task_value(self, task: Task) -> Any:
        """The item of `tasks` a Task names (by id, within its split)."""
        found = self._tasks(self.resolve_split(task.split)).get(task.task_id)
        if found is None:
            raise UserError(
                f"{self.title}: no task {task.task_id!r} in split {task.split!r}; tasks(split) must return the same "
                "tasks on every call (a run names its tasks by id)"
            )
        return found[1]

    def _tasks(self, split: str) -> dict[str, tuple[Task, Any]]:
        cache = self.__dict__.setdefault("_task_cache", {})
        if split not in cache:
            where = f"{type(self).__name__}.tasks({split!r})"
            try:
                items = list(self.tasks(split))
            except UserError:
                raise
            except Exception as exc:  # noqa: BLE001 - the class's own error: one line, the traceback kept
                why = " ".join(str(exc).split())[:300]
                raise EnvFault(
                    f"{where} raised {type(exc).__name__}: {why} (environment {self.name}); see {DOCS_FAULTS}",
                    traceback.format_exc(),
                ) from exc
            if not items:
                raise UserError(
                    f"{where} returned no tasks (environment {self.name}): a split to play needs at least one"
                )
            cache[split] = _index_tasks(self.title, split, items)
        return cache[split]

    def canonical_category(self, name: str) -> str | None:
        """A category of the tasks (train and eval splits), any case; None for one no task has."""
        splits = {self.train_split, *self.eval_splits}
        found = {t.category.lower(): t.category for s in splits for t in self.list_tasks(s)}
        return found.get(str(name).strip().lower())

    # -- playing -------------------------------------------------------------------------------------------------

    def new_game(self, expert: bool | str = False) -> TextGame:
        return TextGame(self, bool(expert))

    def check_plays(self, split: str) -> None:
        """Play `split`'s first task for one step (a random reply) in this process: a class that breaks the protocol
        fails here, in its first second, with the `EnvFault` play would raise later (the stages run it on a plug-in
        before they load a model)."""
        game = self.new_game()
        try:
            first = game.reset(self.list_tasks(split)[0])
            if not first.done:
                game.step(self.parse_action(self.random_response(first, random.Random(0)))[0])
        finally:
            game.close()

    def frame_size(self) -> tuple[int, int] | None:
        return tuple(self.image_size) if self.image_size is not None else None

    # -- prompt and actions --------------------------------------------------------------------------------------

    def render_prompt(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str] | None,
        step: int,
        history: Sequence[tuple[str, str]],
        history_length: int,
    ) -> str:
        lines = [f"You are an agent playing {self.title}."]
        if self.instructions:
            lines.append(self.instructions.strip())
        lines += [f"{TASK_LINE}{task.strip()}", ""]
        shown = list(history)[-history_length:] if history_length > 0 else []
        if shown:
            lines.append(f"Your last {len(shown)} step(s) of {len(history)}:")
            for obs, action in shown:
                lines += [f"Observation: {obs.strip()}", f"Action: {action.strip()}"]
            lines.append("")
        image = f"{IMAGE_PLACEHOLDER}\n" if self.image_size is not None else ""
        lines += [f"Current observation (step {step}):", f"{image}{observation.strip() or '(nothing yet)'}"]
        if admissible:
            lines.append(f"Admissible actions: {', '.join(admissible)}")
        lines += ["", TURN_LINE.format(tag=self.action_tag)]
        return "\n".join(lines)

    def insert_skill(self, prompt: str, skill: str) -> str:
        """The skill block right after the task (a multi-line task ends at the blank line that follows it)."""
        start = prompt.find(TASK_LINE)
        end = prompt.find("\n\n", start) if start >= 0 else -1
        if end < 0:
            return insert_after_line(prompt, TASK_LINE, skill)
        last = prompt.rfind("\n", start, end) + 1 if "\n" in prompt[start:end] else start  # the task's last line
        return prompt[:last] + insert_after_line(prompt[last:], prompt[last:end], skill)

    def parse_action(self, response: str) -> tuple[str, bool]:
        """The text inside the last <action> </action> (valid with <think> </think> too); a reply without the tags is
        invalid and its last line is sent."""
        tag = re.escape(self.action_tag)
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", response, re.DOTALL | re.IGNORECASE)
        if found and found[-1].strip():
            return found[-1].strip(), "<think>" in response and "</think>" in response
        lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
        return (lines[-1] if lines else ""), False

    def format_response(self, think: str, action: str) -> str:
        return f"<think>{think}</think>\n<{self.action_tag}>{action}</{self.action_tag}>"

    def random_response(self, result: StepResult, rng: random.Random) -> str:
        """A random admissible action, or (free text) a random word of the observation: the floor."""
        choices = list(result.admissible or []) or re.findall(r"\w+", result.observation) or ["?"]
        return self.format_response("I pick a random action.", rng.choice(choices))

    # -- analysis ------------------------------------------------------------------------------------------------

    def rules_skill(self, trajectory) -> tuple[str, str]:
        return generic_rules_skill(trajectory, self.title)


class TextGame:
    """One episode slot of a TextEnv: a fresh instance of the class plays it. Every call into the class passes
    through here (the socket): an exception, a wrong shape, a reward that is not a finite number or an observation
    that is not text is an `EnvFault`, one line naming the class, the method, the task and the step."""

    def __init__(self, env: TextEnv, expert: bool = False):
        self.env = env
        self.expert = expert
        self.task = ""
        self.label: str | None = None
        self.steps = 0
        self.total = 0.0
        self.play = self._call("__init__", lambda: type(env)(env.data_root, **env.options))

    def reset(self, task: Task) -> StepResult:
        value = self.env.task_value(task)
        self.total, self.steps, self.label = 0.0, 0, task.label
        first = self._call("reset", self.play.reset, value)
        # after reset: a game may learn its task's text there
        self.task = self._text("task_text", self._call("task_text", self.play.task_text, value), "the task text")
        return self._result("reset", first, 0.0, False, {})

    def step(self, action: str) -> StepResult:
        self.steps += 1
        out = self._call("step", self.play.step, action)
        if not isinstance(out, tuple) or len(out) not in (3, 4):
            shape = f"a {len(out)}-tuple" if isinstance(out, tuple) else f"a {type(out).__name__}"
            raise self._fault("step", f"returned {shape}, not (observation, reward, done[, info])")
        observation, reward, done, info = (*out, {}) if len(out) == 3 else out
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            raise self._fault("step", f"returned the reward {reward!r} ({type(reward).__name__}), not a number")
        if not math.isfinite(reward):
            raise self._fault("step", f"returned the reward {float(reward)}, not a finite number")
        if not isinstance(info, dict | None):
            raise self._fault("step", f"returned info of type {type(info).__name__}, not a dict")
        self.total += float(reward)
        info = dict(info or {})
        if "invalid" in info:  # the game refused the move: the turn counts as invalid (rollout/loop.py)
            info["invalid"] = bool(info["invalid"])
        return self._result("step", observation, float(reward), bool(done), info)

    def _result(self, method: str, observation: Any, reward: float, done: bool, info: dict) -> StepResult:
        text, image = (
            (observation.text, observation.image) if isinstance(observation, Observation) else (observation, None)
        )
        text = self._text(method, text, "an observation")
        if image is not None and not isinstance(image, bytes):
            image = self._call(method, encode_png, image)
        won = bool(self._call("is_won", self.play.is_won, self.total, done))
        admissible = None if done else self._call("admissible", self.play.admissible)
        if admissible is not None and not isinstance(admissible, list | tuple):
            raise self._fault("admissible", f"returned a {type(admissible).__name__}, not a list of actions or None")
        if admissible is not None:
            admissible = [self._text("admissible", a, "an admissible action") for a in admissible]
        expert = self._call("expert", self.play.expert) if self.expert and not (done or won) else None
        return StepResult(
            observation=text,
            admissible=admissible,
            won=won,
            done=done or won,
            task=self.task,
            expert_action=self._text("expert", expert, "the expert's action") if expert is not None else None,
            reward=reward,
            score=min(1.0, max(0.0, self.total)),
            info={**info, "return": round(self.total, 6)},
            image=image,
        )

    def close(self) -> None:
        self._call("close", self.play.close)

    # -- the socket's checks -------------------------------------------------------------------------------------

    def _fault(self, method: str, problem: str, detail: str = "", fix: str = "") -> EnvFault:
        where = f"task {self.label}, " if self.label is not None else ""
        when = f"step {self.steps}" if self.steps else "at reset" if self.label is not None else "when made"
        return EnvFault(
            f"{type(self.env).__name__}.{method} {problem} (environment {self.env.name}, {where}{when}); "
            f"{fix or f'see {DOCS_FAULTS}'}",
            detail,
        )

    def _call(self, method: str, fn, *args):
        """`fn(*args)`, a call into the class: its exception is an EnvFault (the traceback is its detail)."""
        try:
            return fn(*args)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - the class's own error: one line naming where, the traceback kept
            why = " ".join(str(exc).split())[:300]
            raise self._fault(method, f"raised {type(exc).__name__}: {why}", traceback.format_exc()) from exc

    def _text(self, method: str, value: Any, what: str) -> str:
        """`value` when it is text that a record can hold; else an EnvFault saying what it is."""
        if isinstance(value, bytes | bytearray):
            raise self._fault(method, f"returned {what} as bytes", fix="decode it to a str (e.g. .decode('utf-8'))")
        if not isinstance(value, str):
            raise self._fault(method, f"returned {what} of type {type(value).__name__}, not a str")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise self._fault(
                method,
                f"returned {what} holding the lone surrogate {value[exc.start]!r} at character {exc.start}, not text",
                fix="decode bytes with errors='replace', not 'surrogateescape'",
            ) from None
        return value


def _index_tasks(title: str, split: str, items: list) -> dict[str, tuple[Task, Any]]:
    """Task id -> (Task, item): a dict's "id", a string or number itself, else the position; ids are unique."""
    out: dict[str, tuple[Task, Any]] = {}
    for i, item in enumerate(items):
        if isinstance(item, dict):
            task_id = str(item.get("id", i))
            category = str(item.get("category") or DEFAULT_CATEGORY)
        else:
            task_id = str(item) if isinstance(item, str | int) and not isinstance(item, bool) else str(i)
            category = DEFAULT_CATEGORY
        if task_id in out:
            raise UserError(f"{title}: two tasks of split {split!r} share the id {task_id!r}; give each dict an 'id'")
        out[task_id] = (Task(task_id=task_id, category=category, split=split), item)
    return out


def generic_rules_skill(trajectory, title: str) -> tuple[str, str]:
    """(episode_summary, episode_skill) of the generic rules analyzer: a rule from the outcome alone (won; most
    replies unreadable; one action sent again and again; the steps ran out). A baseline so the pipeline runs offline
    on any text environment; an environment that knows its game writes a better one."""
    turns = list(trajectory.turns)
    n = len(turns)
    invalid = sum(not t.valid for t in turns)
    if trajectory.won:
        return (
            f"The agent completed the {title} task in {n} step(s).",
            "Read the task and the latest observation before every move, keep the reply format (reasoning inside "
            "<think>, one action inside <action>) and act on the game's feedback until the task is done.",
        )
    if n and invalid * 2 >= n:
        return (
            f"The agent failed: {invalid} of its {n} replies did not follow the reply format.",
            "Write the reasoning inside <think> </think> and exactly one action inside <action> </action>; a reply "
            "without both tags wastes the step.",
        )
    action, count = Counter(t.action for t in turns).most_common(1)[0] if turns else ("", 0)
    if count >= 3:
        return (
            f"The agent failed: it sent the same action {count} times in {n} steps.",
            "Never repeat an action the game has already answered; when an observation does not change, the action "
            "did not help, so try a different one.",
        )
    return (
        f"The agent failed: the {n} steps ran out before the task was done.",
        "Use each observation's feedback to narrow down the next action and spend no step on moves that change "
        "nothing; the step budget is small.",
    )
