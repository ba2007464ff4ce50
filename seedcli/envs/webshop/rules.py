"""WebShop's part of the offline `rules` analyzer: a hindsight skill read off the trajectory itself.

A baseline so the pipeline runs without an API key, not the paper's analyzer. For a purchase with reward 1.0 it
writes the workflow (search words, the product opened, the options chosen, the price check, buy). For a failure it
writes one avoidance rule for what went wrong, checked in this order: never bought, wrong options, over budget,
wrong product.
"""

from __future__ import annotations

import re

RULES_VERSION = "webshop-rules-v1"  # bump when the generated text changes

_OPTIONS_RE = re.compile(r" with (.+?)(?:, and price lower than [\d.]+ dollars)?$")
_BUDGET_RE = re.compile(r"price lower than ([\d.]+) dollars")
_PRICE_RE = re.compile(r"Price: \$([\d,]+(?:\.\d+)?)")
_ASIN_RE = re.compile(r"^click\[(b[0-9a-z]{9})\]$")
_BUTTONS = {
    "back to search",
    "< prev",
    "next >",
    "description",
    "features",
    "reviews",
    "attributes",
    "buy now",
    "search",
}


def goal_options(task: str) -> dict[str, str]:
    """Options an instruction asks for: "... with color: navy, and size: large, and price ..." -> {color: navy, ...}."""
    m = _OPTIONS_RE.search(task)
    if not m:
        return {}
    out: dict[str, str] = {}
    for part in m.group(1).split(", and "):
        name, sep, value = part.partition(": ")
        if sep:
            out[name.strip().lower()] = value.strip().lower()
    return out


def budget(task: str) -> float | None:
    """The price cap of an instruction, if it has one."""
    m = _BUDGET_RE.search(task)
    return float(m.group(1)) if m else None


def _base(task: str) -> str:
    text = re.sub(r", and price lower than [\d.]+ dollars$", "", task.strip())
    return re.sub(r" with [^:]+: .*$", "", text).strip()


def _episode(trajectory) -> dict:
    """What the agent did: searches, products opened, options clicked, price seen on the bought product, bought."""
    searches: list[str] = []
    products: list[str] = []
    options: list[str] = []
    price: float | None = None
    bought = False
    turns = list(trajectory.turns)
    for i, turn in enumerate(turns):
        action = (turn.action or "").strip()
        if action.startswith("search[") and action.endswith("]"):
            searches.append(action[7:-1])
        elif (m := _ASIN_RE.match(action)) is not None:
            products.append(m.group(1))
            options = []
            after = turns[i + 1].observation if i + 1 < len(turns) else ""
            pm = _PRICE_RE.search(after)
            price = float(pm.group(1).replace(",", "")) if pm else None
        elif action == "click[buy now]":
            bought = True
        elif action.startswith("click[") and action.endswith("]") and action[6:-1] not in _BUTTONS:
            options.append(action[6:-1])
    return {"searches": searches, "products": products, "options": options, "price": price, "bought": bought}


def rules_skill(trajectory) -> tuple[str, str]:
    """(episode_summary, episode_skill) for one WebShop trajectory."""
    task = trajectory.task.strip().rstrip(".")
    base = _base(task)
    wanted = goal_options(task)
    cap = budget(task)
    ep = _episode(trajectory)
    n = len(trajectory.turns)
    score = float(getattr(trajectory, "score", 0.0) or 0.0)
    query = ep["searches"][-1] if ep["searches"] else base.lower()
    wanted_text = ", ".join(f"{k}: {v}" for k, v in wanted.items())
    cap_text = f"{cap:.2f} dollars" if cap is not None else "the budget"
    if trajectory.won:
        steps = [f"search for '{query}'"]
        if ep["products"]:
            steps.append(f"open the result that matches '{base}'")
        if wanted:
            steps.append(f"click the options {wanted_text}")
        if cap is not None:
            steps.append(f"check that the price is below {cap_text}")
        steps.append("click 'buy now'")
        skill = f"For '{base or 'the product'}': " + ", then ".join(steps) + "."
        summary = f"The agent bought a product matching the instruction in {n} step(s) (reward {score:.2f})."
        return summary, skill
    missed = [v for v in wanted.values() if v not in ep["options"]]
    if not ep["bought"]:
        summary = (
            f"The agent never clicked 'buy now' in {n} step(s): it searched {len(ep['searches'])} time(s) and "
            f"opened {len(ep['products'])} product(s)."
        )
        skill = (
            f"Do not run out of steps: search once with the instruction's key words ('{base.lower()}'), open the "
            "best-matching result, choose the requested options and click 'buy now' instead of browsing further."
        )
    elif missed:
        summary = f"The agent bought without choosing the requested option(s) {', '.join(missed)} (reward {score:.2f})."
        skill = (
            f"Before clicking 'buy now', click every option the instruction names ({wanted_text}); an option left "
            "unchosen or chosen differently loses reward."
        )
    elif cap is not None and ep["price"] is not None and ep["price"] > cap:
        summary = (
            f"The agent bought a product at ${ep['price']:.2f}, above the budget of {cap_text} (reward {score:.2f})."
        )
        skill = (
            f"Never buy a product priced at or above {cap_text}: read 'Price:' on the item page and go back to the "
            "results for a cheaper match."
        )
    else:
        summary = f"The agent bought a product that does not match '{base}' (reward {score:.2f})."
        skill = (
            f"Open only results whose title names the requested kind of product ('{base.lower()}') and has its "
            "attributes; compare the title and features with the instruction before buying."
        )
    return summary, skill
