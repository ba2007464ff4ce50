"""WebShop's part of `--analyzer hindsight` (seedcli/envs/hindsight.py): the episode replayed against the expert.

The probe reads the page after every step (`page_state`: which page, which item, the options chosen, the results).
A lost episode's turn is the first one off the expert's path (any search counts as the expert's search: only its
results matter), or the search before it when the goal item is not among that search's results at all; the skill
compares what the agent did there with the goal: the options it asks for against those the item offers ("the goal
asks for size: medium; the item offers size: large, x-large"), the price against the budget, the kind of product,
and names the expert's action. A won episode's turn is the click on the item it bought. The expert's click names the
goal item's ASIN, which WebShop's leak rule flags (`reward.goal_spans`): the audit counts it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from seedcli.envs.hindsight import Replayed, divergence, generic_skill, quote, same_action
from seedcli.envs.webshop.data import Shop
from seedcli.envs.webshop.game import PRODUCT_WINDOW, top_products

HINDSIGHT_VERSION = "webshop-hindsight-v1"  # bump when the generated text changes
SUB_PAGES = ("description", "features", "reviews", "attributes")


@dataclass
class Page:
    """What the probe reads off the session after a step."""

    kind: str  # index | search_results | item_page | item_sub_page | done
    asin: str | None = None  # the item open (upper case), if any
    options: dict[str, str] = field(default_factory=dict)  # option name -> value chosen on it
    results: list[str] = field(default_factory=list)  # the ASINs the last search returned, in rank order


def page_state(slot, result) -> Page:
    """The replay's probe: the session's page, item, chosen options and search results."""
    s = slot.session
    return Page(s.page_kind, s.asin, dict(s.options), [p["asin"] for p in s.results])


def _action_arg(action: str) -> tuple[str, str]:
    """("search" | "click" | "", its argument) of an action."""
    text = action.strip()
    for verb in ("search", "click"):
        if text.lower().startswith(f"{verb}[") and text.endswith("]"):
            return verb, text[len(verb) + 1 : -1].strip()
    return "", text


def _said(action: str) -> str:
    """The expert's action in words: "clicked 'b07gyww3ny'", "searched '...'"."""
    verb, arg = _action_arg(action)
    return f"{verb}ed '{quote(arg, 80)}'" if verb else f"did '{quote(action, 80)}'"


def _on_path(step: Replayed) -> bool:
    """The expert's action, or a search where the expert searches (the query's words are the agent's own)."""
    if step.expert is None or same_action(step.action, step.expert):
        return True
    return _action_arg(step.action)[0] == "search" and _action_arg(step.expert)[0] == "search"


def _item(shop: Shop, asin: str) -> str:
    product = shop.product_by_asin.get(asin.upper(), {})
    title = quote(product.get("Title", ""), 60)
    return f"{asin.lower()} ('{title}', {product.get('Price', 'no price')})"


def _mismatch(shop: Shop, goal: dict[str, Any], asin: str) -> tuple[str, str]:
    """(how item `asin` falls short of the goal, the rule that checks it): a missing option value, the price, the kind
    of product, or its attributes."""
    product = shop.product_by_asin.get(asin.upper(), {})
    offered = {str(k).lower(): [str(v).lower() for v in vs] for k, vs in (product.get("options") or {}).items()}
    for name, value in goal["goal_options"].items():
        values = offered.get(str(name).lower())
        if values is None or str(value).lower() not in values:
            has = f"offers {name}: {', '.join(values[:4])}" if values else f"has no {name} option"
            return (
                f"the goal asks for {name}: {value}; the item {has}",
                f"check the {name} options on the item page before buying: the item must offer {name}: {value}, "
                "else go back to the results for one that does",
            )
    price, cap = shop.prices.get(asin.upper()), goal.get("price_upper") or 0
    if price is not None and cap and price > cap:
        return (
            f"the item costs ${price:.2f}, above the goal's budget of ${cap:.2f}",
            "compare each item's price with the budget before opening it, and buy only below it",
        )
    if product.get("query") and product["query"] != goal["query"]:
        return (
            f"the item is a {product['query']}, and the goal asks for {goal['query']}",
            f"open only items whose title names the kind of product the goal asks for ({goal['query']})",
        )
    attributes = ", ".join(goal.get("attributes") or []) or "the goal's attributes"
    return (
        f"the item is not the one whose title and features match every attribute the goal names ({attributes})",
        f"compare the title and features with every attribute the goal names ({attributes}) before buying",
    )


def _expert_search(shop: Shop, goal: dict[str, Any]) -> str:
    """Where the expert's search (the instruction's words) puts the goal item."""
    found = [p["asin"] for p in top_products(shop, goal["instruction_text"].lower().split(" "), random.Random(0))]
    if goal["asin"] not in found:
        return "not among the results of the instruction's own words either"
    return f"on results page {found.index(goal['asin']) // PRODUCT_WINDOW + 1} of the instruction's own words"


def _lost(shop: Shop, goal: dict[str, Any], turn: Replayed) -> tuple[str, str, str]:
    """(what happened at `turn`, what the expert did instead, the rule) of a lost episode."""
    verb, arg = _action_arg(turn.action)
    expert = turn.expert or "nothing"
    before: Page = turn.probe_before
    if verb == "search":
        return (
            f"searched '{quote(arg, 60)}', whose {len(turn.probe_after.results)} results do not hold the goal item",
            f"the expert searched '{quote(_action_arg(expert)[1], 80)}' instead (the goal item is "
            f"{_expert_search(shop, goal)})",
            "search with the goal's product words and its main attributes; when no result matches them, search "
            "again rather than open the closest item",
        )
    if verb == "click" and arg.upper() in shop.product_by_asin and before.kind == "search_results":
        why, rule = _mismatch(shop, goal, arg)
        return f"opened {_item(shop, arg)}: {why}", f"the expert {_said(expert)} there", rule
    item = before.asin or ""
    if arg.lower() == "buy now" and before.kind == "item_page":
        if item.upper() != goal["asin"]:
            why, rule = _mismatch(shop, goal, item)
            return f"bought {_item(shop, item)}: {why}", f"the expert {_said(expert)} there", rule
        chosen = ", ".join(f"{k}: {v}" for k, v in before.options.items())
        chosen = f"with the options {chosen}" if chosen else "with no option chosen"
        wanted = ", ".join(f"{k}: {v}" for k, v in goal["goal_options"].items())
        return (
            f"clicked 'buy now' on the right item {chosen}, while the goal asks for {wanted}",
            f"the expert {_said(expert)} first",
            f"before 'buy now', click every option the goal names ({wanted}); an option left unchosen or chosen "
            "differently loses reward",
        )
    if verb == "click" and before.kind == "item_page" and _action_arg(expert)[1].lower() not in SUB_PAGES:
        opens = arg.lower() in SUB_PAGES
        return (
            f"clicked '{quote(arg, 40)}' on item {_item(shop, item)}",
            f"the expert {_said(expert)} there",
            "on the item page the options and the price are all a purchase needs; opening description, features or "
            "reviews spends steps without changing it"
            if opens
            else "once an item matches the goal, choose the options the goal names and buy it instead of leaving",
        )
    if arg.lower() == "next >" and goal["asin"].lower() in {a.lower() for a in _page(before)}:
        return (
            "turned to the next page of results",
            f"the expert {_said(expert)} on this page",
            "read every result on a page before turning to the next: the goal item was already on it",
        )
    return (
        f"did '{quote(turn.action, 60)}' on the {before.kind.replace('_', ' ')}",
        f"the expert {_said(expert)} there",
        "follow the shortest way to the purchase: search, open the item that matches, choose its options, buy",
    )


def _page(page: Page) -> list[str]:
    return page.results[:PRODUCT_WINDOW] if page.kind == "search_results" else []


def hindsight_skill(
    trajectory, steps: list[Replayed], shop: Shop, goal: dict[str, Any], title: str = "WebShop"
) -> tuple[str, str]:
    """(episode_summary, episode_skill) of one WebShop episode from its replay (`page_state` as the probe) and its
    goal (`shop.goals[index]`)."""
    if not steps:
        return generic_skill(title, trajectory, steps)
    n = len(steps)
    score = float(steps[-1].after.score)
    goal_text = goal["instruction_text"].strip()
    if trajectory.won:
        opened = [s for s in steps if _action_arg(s.action)[1].upper() in shop.product_by_asin]
        turn = opened[-1] if opened else steps[-1]
        asin = steps[-1].probe_before.asin or goal["asin"]
        chosen = ", ".join(f"{k}: {v}" for k, v in steps[-1].probe_before.options.items())
        chosen = f"chose {chosen}" if chosen else "chose no option (the goal names none)"
        cap = goal.get("price_upper") or 0
        budget = f", under the ${cap:.2f} budget" if cap else ""
        summary = f"The agent bought {_item(shop, asin)} in {n} step(s): it {chosen}; reward {score:.2f}."
        skill = (
            f"At turn {turn.step} the agent opened {_item(shop, asin)}{budget}, the item the expert opens for this "
            f"goal, then {chosen} and bought it. Open an item whose title names the kind of product asked for "
            "and that offers every option the goal names, then click each of those options before 'buy now'."
        )
        return summary, skill
    turn = divergence(steps, _on_path)
    upto = turn.index if turn is not None else n
    if turn is None or (turn.probe_before.kind == "search_results" and goal["asin"] not in turn.probe_before.results):
        # the results never held the goal item: the search that made them is where the episode went wrong
        searches = [s for s in steps[:upto] if _action_arg(s.action)[0] == "search"]
        missed = [s for s in searches if goal["asin"] not in s.probe_after.results]
        turn = missed[-1] if missed else turn
    if turn is None:
        summary = f"The agent followed the expert's actions for {n} step(s) and still ended with reward {score:.2f}."
        skill = (
            f"For '{quote(goal_text, 80)}', even the expert's path did not reach the goal item within {n} step(s): "
            "when the results show no item with the asked attributes, search again with other words before buying."
        )
        return summary, skill
    did, instead, rule = _lost(shop, goal, turn)
    summary = f"The agent ended with reward {score:.2f} after {n} step(s). At turn {turn.step} it {did}; {instead}."
    skill = f"For '{quote(goal_text, 100)}': at turn {turn.step} the agent {did}; {instead}. Rule: {rule}."
    return summary, skill
