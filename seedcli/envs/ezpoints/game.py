"""The EZPoints card game, ported from gym-cards as vendored in verl-agent (commit d0b9724).

Source: `agent_system/environments/env_package/gym_cards/gym-cards/gym_cards/envs/ezpoints.py` (`EZPointEnv`),
reset and seeded as `agent_system/environments/env_package/gym_cards/envs.py` does (`GymCardsWorker.reset(seed)`,
seeds from `GymMultiProcessEnv.reset`). What follows which original piece:

    EZPoints.__init__        EZPointEnv.reset: `random.seed(seed)` then `_generate_cards` (here on a private
                             `random.Random(seed)`, the same stream; the caller's global `random` state is untouched)
    _generate_cards          EZPointEnv._generate_cards and _card_num_to_str, draw for draw
    EZPoints.step            EZPointEnv.step, _is_valid_action, _evaluate_formula, _terminate_step
    EZPoints.image           EZPointEnv._get_observation and get_image (card resize, paste offsets, formula line)
    train_seeds/test_seeds   GymMultiProcessEnv.__init__/reset (np.random.seed, then randint per reset)

Rules, quirks included:
- Cards: the first card's rank is `randint(2, 13)` with a random suit; face cards count 10. If that value divides
  12 (list [1, 2, 3, 4, 6]) a coin (`random() <= 0.5`) makes the second value 12 // first, else it is 12 - first;
  the second card gets a random suit and rank (10 is "T"); a second coin swaps the two cards. Every game is thus
  solvable by `a + b` or `a * b`; aces never occur.
- Actions 0..12 mean the numbers 1..10, then "+", "*", "=". Action -1 (what verl-agent's projection sends for an
  unparseable reply) changes nothing and returns reward 0. Other values are a ValueError (the original would raise
  IndexError or, for negative values, index from the end).
- Truncation is checked first: a step taken while the formula already holds more than 5 tokens returns
  (0, terminated=False, truncated=True, won=False) and changes nothing; so does every later step.
- A number not on the cards, or used more times than the cards hold it, is refused: reward 0, nothing changes.
- "=" evaluates the formula as Python would (tokens joined without spaces: "5" then "7" read as 57, "+5+7" and
  "5++7" are valid) and ends the game (terminated=True): reward 10 when the value is 12 and both cards were used,
  else 0. "=" is never appended to the formula. The original does not refuse steps after the end; neither does
  this port (callers stop at `terminated`).
- verl-agent's worker passes only `terminated` on as `done`, so there a truncated episode runs on to the env's
  `max_steps` (8 in SEED's EZPoints launcher); this port reports truncation and leaves that choice to the caller.

Splits (GymMultiProcessEnv.reset; SEED's `examples/seed_trainer/_common/ezpoints.sh` keeps verl-agent's
`env.seed=0`, validation envs built with seed + 1000, 128 validation games): training games draw seeds from
`np.random.randint(0, 2**16 - 1)`, validation (test) games from `np.random.randint(2**16, 2**32 - 1)` after
`np.random.seed(1000)`. `test_seeds(n)` is that stream's first n values (512 covers the first four validation
rounds of 128; the original's driver shares NumPy's global generator with the training envs, so later rounds there
interleave with training draws). Nothing here imports torch.
"""

from __future__ import annotations

import ast
import operator
import os
import random
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from seedcli.envs.base import find_data_root

NUMBER_ACTIONS = list(range(1, 11))  # actions 0..9
OPERATOR_ACTIONS = ["+", "*", "="]  # actions 10, 11, 12
ACTION_NAMES = [str(n) for n in NUMBER_ACTIONS] + OPERATOR_ACTIONS
NO_OP = -1
TARGET_POINTS = 12
MAX_FORMULA_LEN = 5  # a step on a longer formula is truncated
CANVAS_SIZE = (300, 300)
CANVAS_COLOR = "#35654d"
FONT_NAME = "dejavu/DejaVuSans.ttf"  # as the original asks Pillow for it
FONT_DEBIAN_PATH = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
FONT_SIZE = 20
SUITS = ["H", "S", "D", "C"]
SUIT_WORDS = {"H": "Hearts", "S": "Spades", "D": "Diamonds", "C": "Clubs"}
RANK_WORDS = {"A": "Ace", "T": "10", "J": "Jack", "Q": "Queen", "K": "King"}
CARD_FILES = [f"{s}{r}.png" for s in "CDHS" for r in [*"23456789", "T", "J", "Q", "K", "A"]]

TRAIN_SEED_RANGE = (0, 2**16 - 1)  # np.random.randint's [low, high)
TEST_SEED_RANGE = (2**16, 2**32 - 1)
TEST_SEED_STREAM = 1000  # verl-agent's val envs: env.seed (0) + 1000


def train_seeds(n: int, seed: int = 0) -> list[int]:
    """n training-game seeds as verl-agent draws them after `np.random.seed(seed)` (global generator untouched)."""
    return np.random.RandomState(seed).randint(*TRAIN_SEED_RANGE, size=n).tolist()


def test_seeds(n: int = 512) -> list[int]:
    """The fixed test split: the first n validation seeds of verl-agent/SEED (`np.random.seed(1000)`, then
    `randint(2**16, 2**32 - 1)`); a prefix of the 512 is a smaller test."""
    return np.random.RandomState(TEST_SEED_STREAM).randint(*TEST_SEED_RANGE, size=n).tolist()


test_seeds.__test__ = False  # not a pytest test when imported into a test module


def _card_num_to_str(num: int) -> str:
    return {1: "A", 10: "T", 11: "J", 12: "Q", 13: "K"}.get(num, str(num))


def _generate_cards(rng: random.Random) -> tuple[list[int], list[str]]:
    """EZPointEnv._generate_cards, draw for draw, on `rng` (the module-level generator in the original)."""
    cards_num = [rng.randint(2, 13)]
    cards_suit = [rng.choice(SUITS)]
    cards = [suit + _card_num_to_str(num) for num, suit in zip(cards_num, cards_suit, strict=True)]
    cards_num = [min(x, 10) for x in cards_num]
    if cards_num[0] in [1, 2, 3, 4, 6] and rng.random() <= 0.5:
        cards_num.append(12 // cards_num[0])
    else:
        cards_num.append(12 - cards_num[0])
    cards.append(rng.choice(SUITS) + _card_num_to_str(cards_num[1]))
    if rng.random() <= 0.5:
        cards_num, cards = cards_num[::-1], cards[::-1]
    return cards_num, cards


_BINOPS = {ast.Add: operator.add, ast.Mult: operator.mul, ast.Pow: operator.pow}


def _eval_node(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_node(node.left), _eval_node(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        return +_eval_node(node.operand)
    raise ValueError(f"unexpected formula node {type(node).__name__}")


def evaluate(formula: list[str]) -> int | None:
    """The formula's value as the original's `eval("".join(formula))` gives it (its tokens are digits, "+" and "*",
    so Python's grammar yields sums, products, powers and unary plus), or None where eval raises."""
    try:
        return _eval_node(ast.parse("".join(formula), mode="eval"))
    except (SyntaxError, ValueError):
        return None


def resolve_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The EZPoints data root (the folder holding cards/<suit><rank>.png): `explicit`, else $EZPOINTS_DATA, else
    ../shared/ezpoints next to the working directory or the repository."""

    def has_data(root: Path) -> bool:
        return all((root / "cards" / name).is_file() for name in CARD_FILES)

    def missing(source: str, root: Path | None) -> str:
        need = "cards/ with the 52 card images (C2.png ... SA.png)"
        if source == "explicit":
            return f"EZPoints data not found at {root} (no {need}): pass the folder that holds them"
        if source == "env":
            return f"EZPoints data not found: EZPOINTS_DATA={root} has no {need}; set it to the folder holding cards/"
        return f"EZPoints data not found: set EZPOINTS_DATA=/path/to/ezpoints (the folder holding {need})"

    return find_data_root(explicit, "EZPOINTS_DATA", "ezpoints", has_data, missing)


@lru_cache(maxsize=1)
def formula_font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVuSans 20 found as the original finds it (Pillow's search of the font folders for
    dejavu/DejaVuSans.ttf), else at the Debian path, else Pillow's default font (size 20 where Pillow allows)."""
    for name in (FONT_NAME, FONT_DEBIAN_PATH):
        try:
            return ImageFont.truetype(name, FONT_SIZE)
        except OSError:
            pass
    try:
        return ImageFont.load_default(FONT_SIZE)
    except TypeError:  # Pillow < 10.1 has no size argument
        return ImageFont.load_default()


def has_original_font() -> bool:
    """Whether DejaVuSans (the original's font) is what `image()` draws with."""
    return isinstance(formula_font(), ImageFont.FreeTypeFont) and "DejaVu" in (formula_font().getname()[0] or "")


@lru_cache(maxsize=64)
def _card_image(cards_dir: str, card: str, size: tuple[int, int]) -> Image.Image:
    """get_image(card) resized as the original does (Pillow's default resampling for the file's mode)."""
    with Image.open(os.path.join(cards_dir, f"{card}.png")) as image:
        return image.resize(size)


def card_words(card: str) -> str:
    """A card code in words: "DK" -> "King of Diamonds", "H5" -> "5 of Hearts"."""
    rank = card[1:]
    return f"{RANK_WORDS.get(rank, rank)} of {SUIT_WORDS[card[0]]}"


class EZPoints:
    """One EZPoints game: `EZPoints(seed)`, then `step(action)` until terminated or truncated."""

    def __init__(self, seed: int, data_root: str | os.PathLike | None = None, target_points: int = TARGET_POINTS):
        self.seed = operator.index(seed)
        self.target_points = target_points
        self._data_root = data_root
        # The original calls random.seed(seed) on the global generator; a private Random(seed) draws the same
        # stream and leaves the caller's global state as it was.
        self.numbers, self.cards = _generate_cards(random.Random(self.seed))
        self.formula: list[str] = []
        self.used_cards: list[int] = []
        self.won = False

    def step(self, action: int) -> tuple[int, bool, bool, bool]:
        """EZPointEnv.step: returns (reward, terminated, truncated, won); see the module docstring for the rules."""
        action = operator.index(action)
        if not NO_OP <= action < len(ACTION_NAMES):
            raise ValueError(f"EZPoints action must be -1..{len(ACTION_NAMES) - 1}, got {action}")
        if action == NO_OP:
            return 0, False, False, False
        if len(self.formula) > MAX_FORMULA_LEN:
            return 0, False, True, False
        if action < len(NUMBER_ACTIONS):
            number = NUMBER_ACTIONS[action]
            used = self.used_cards + [number]
            if any(used.count(x) > self.numbers.count(x) for x in used):
                return 0, False, False, False
            self.used_cards.append(number)
            self.formula.append(str(number))
            return 0, False, False, False
        token = OPERATOR_ACTIONS[action - len(NUMBER_ACTIONS)]
        if token != "=":
            self.formula.append(token)
            return 0, False, False, False
        reward = 10 if evaluate(self.formula) == self.target_points and len(self.used_cards) == 2 else 0
        self.won = reward > 0
        return reward, True, False, self.won

    def formula_text(self) -> str:
        """The formula as verl-agent's prompt shows it (tokens joined without spaces)."""
        return "".join(self.formula)

    def text(self) -> str:
        """The text-only observation (EZPointEnv renders images only; gym-cards' text_wrapper.py shows card codes
        and their numbers instead): the cards in words and the formula as the image's line writes it."""
        line = f"Cards: {card_words(self.cards[0])}, {card_words(self.cards[1])}. Formula: {' '.join(self.formula)}"
        return line.rstrip()

    def image(self) -> np.ndarray:
        """EZPointEnv._get_observation: uint8 300x300x3, both cards pasted on the green canvas, formula below."""
        width, height = CANVAS_SIZE
        card_width = int(width / len(self.cards) * 0.9)
        card_height = int(card_width * 7 / 5)
        cards_dir = str(resolve_data_root(self._data_root) / "cards")
        canvas = Image.new("RGB", CANVAS_SIZE, CANVAS_COLOR)
        for i, card in enumerate(self.cards):
            card_image = _card_image(cards_dir, card, (card_width, card_height))
            x_offset = 5 + int(i * card_image.width * 1.1)
            y_offset = int((height - card_image.height) / 2)
            canvas.paste(card_image, (x_offset, y_offset))
        draw = ImageDraw.Draw(canvas)
        line = "Formula: " + " ".join(self.formula)
        draw.text((10, height * 0.86), line, fill="white", font=formula_font())
        return np.array(canvas)
