"""The WebShop expert and random policies, played on a `WebShopSession`.

The expert knows the goal (its ASIN and options): it searches the instruction text, pages through the results to
the goal product, clicks the goal's option values and buys. It is the ceiling this search engine allows; it misses
only where the product is not among the 50 results. The random policy clicks uniformly among what the page offers.
"""

from __future__ import annotations

import random

from seedcli.envs.webshop.game import END_BUTTON, NEXT_PAGE, PREV_PAGE, PRODUCT_WINDOW, WebShopSession

SEARCH_PLACEHOLDER = "search[<your query>]"  # how verl-agent lists the search bar among the admissible actions


def expert_action(session: WebShopSession) -> str | None:
    """The expert's next action in `session`, or None once the episode is over."""
    if session.done:
        return None
    goal = session.goal
    kind = session.page_kind
    if kind == "index":
        return f"search[{goal['instruction_text']}]"
    if kind == "item_sub_page":
        return f"click[{PREV_PAGE.lower()}]"
    clickables = session.clickables()
    target = goal["asin"].lower()
    if kind == "search_results":
        if target in clickables:
            return f"click[{target}]"
        page = session.page or 1
        if page * PRODUCT_WINDOW < len(session.results):
            return f"click[{NEXT_PAGE.lower()}]"
        # The goal product is not among the results: buy the best-ranked product of this page.
        on_page = [a for a, (what, _) in clickables.items() if what == "product"]
        if on_page:
            return f"click[{on_page[0]}]"
        if PREV_PAGE.lower() in clickables:
            return f"click[{PREV_PAGE.lower()}]"
        return f"search[{goal['query']}]"
    if kind == "item_page":
        chosen = set(session.options.values())
        for value in goal["goal_options"].values():
            # A value already chosen (or shared by two option rows) is clicked once only.
            if value in clickables and clickables[value][0] == "option" and value not in chosen:
                return f"click[{value}]"
        return f"click[{END_BUTTON.lower()}]"
    return None


def admissible_actions(session: WebShopSession) -> list[str]:
    """The actions verl-agent lists for the page: the search bar as `search[<your query>]`, then every clickable."""
    available = session.available_actions()
    actions = [SEARCH_PLACEHOLDER] if available["has_search_bar"] else []
    return actions + [f"click[{c}]" for c in available["clickables"]]


def random_action(admissible: list[str], task: str, rng: random.Random) -> str:
    """A random admissible action; the search bar gets a few random words of the task as its query."""
    choices = [a for a in admissible if a != "click[search]"] or list(admissible) or [SEARCH_PLACEHOLDER]
    action = rng.choice(choices)
    if action == SEARCH_PLACEHOLDER:
        words = task.split() or ["product"]
        action = f"search[{' '.join(rng.sample(words, k=min(3, len(words))))}]"
    return action
