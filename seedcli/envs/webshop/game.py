"""WebShop's text environment (web_agent_site/envs/web_agent_text_env.py), without a browser.

    session = WebShopSession(load_shop())
    obs = session.reset(goal_index=0)     # "WebShop [SEP] Instruction: [SEP] i need ... [SEP] Search"
    obs, reward, done = session.step("search[long clip-in hair extension]")
    session.available_actions()           # {"has_search_bar": False, "clickables": ["back to search", ...]}

Pages, buttons and their order are those of WebShop's HTML templates; the observation is the visible text of the
page joined by " [SEP] ", as WebShop's `observation_mode="text"` gives it. Clickables are lower-cased; an action that
is neither a non-empty `search[...]` nor a `click[...]` of a clickable on the page leaves the page unchanged.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from seedcli.envs.webshop.data import SEARCH_RETURN_N, Shop
from seedcli.envs.webshop.reward import get_reward

PRODUCT_WINDOW = 10
END_BUTTON = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
SEP = " [SEP] "
_ACTION_RE = re.compile(r"(.+)\[(.+)\]")


def parse_action(action: str) -> tuple[str, str | None]:
    """WebShop's parse_action: "click[Buy Now]" -> ("click", "Buy Now"); no brackets -> (action, None)."""
    m = _ACTION_RE.match(action)
    if m is None:
        return action, None
    return m.group(1), m.group(2)


def top_products(shop: Shop, keywords: list[str], rng: random.Random) -> list[dict[str, Any]]:
    """WebShop's get_top_n_product_from_keywords, with its special prefixes <r> (random), <a>, <c> and <q>."""
    first = keywords[0] if keywords else ""
    if first == "<r>":
        return rng.sample(shop.products, k=min(SEARCH_RETURN_N, len(shop.products)))
    if first == "<a>":
        asins = shop.attribute_to_asins.get(" ".join(keywords[1:]).strip(), set())
        return [p for p in shop.products if p["asin"] in asins]
    if first == "<c>":
        category = keywords[1].strip() if len(keywords) > 1 else ""
        return [p for p in shop.products if p["category"] == category]
    if first == "<q>":
        query = " ".join(keywords[1:]).strip()
        return [p for p in shop.products if p["query"] == query]
    asins = shop.engine.search(" ".join(keywords), k=SEARCH_RETURN_N)
    return [shop.product_by_asin[a] for a in asins if a in shop.product_by_asin]


class WebShopSession:
    """One shopper on the simulated site: WebShop's SimServer session and SimBrowser page, as text."""

    def __init__(self, shop: Shop, seed: int = 0):
        self.shop = shop
        self.rng = random.Random(seed)  # only the <r> search prefix draws from it
        self.goal: dict[str, Any] = {}
        self.goal_index = -1
        self._reset_session()

    # -- session state ------------------------------------------------------------------------------------------

    def _reset_session(self) -> None:
        self.page_kind = "index"  # index | search_results | item_page | item_sub_page | done
        self.sub_page: str | None = None
        self.keywords: list[str] | None = None
        self.page: int | None = None
        self.asin: str | None = None
        self.asins: set[str] = set()
        self.options: dict[str, str] = {}
        self.results: list[dict[str, Any]] = []
        self.done = False
        self.reward = 0.0
        self.reward_info: dict[str, Any] = {}

    def reset(self, goal_index: int) -> str:
        """Start a session on goal `goal_index` (of the shuffled goal list); returns the search page's text."""
        self.goal_index = goal_index
        self.goal = self.shop.goals[goal_index]
        self._reset_session()
        return self.observation()

    @property
    def instruction_text(self) -> str:
        return self.goal["instruction_text"]

    # -- pages --------------------------------------------------------------------------------------------------

    def _product(self) -> dict[str, Any]:
        return self.shop.product_by_asin[self.asin]  # type: ignore[index]

    def page_texts(self) -> list[str]:
        """The visible text pieces of the current page, in document order (empty pieces dropped)."""
        instr = self.instruction_text
        kind = self.page_kind
        if kind == "index":
            texts = ["WebShop", "Instruction:", instr, "Search"]
        elif kind == "search_results":
            page = self.page or 1
            texts = ["Instruction:", instr, BACK_TO_SEARCH, f"Page {page} (Total results: {len(self.results)})"]
            if page > 1:
                texts.append(PREV_PAGE)
            texts.append(NEXT_PAGE)
            for item in self._page_products():
                texts += [item["asin"], item["Title"], item["Price"]]
        elif kind == "item_page":
            product = self._product()
            texts = ["Instruction:", instr, BACK_TO_SEARCH, PREV_PAGE]
            for option_name, values in product["options"].items():
                texts.append(option_name)
                texts.extend(values)
            texts += [
                product["Title"],
                f"Price: {product['Price']}",
                f"Rating: {product['Rating']}",
                "Description",
                "Features",
                "Reviews",
                END_BUTTON,
            ]
        elif kind == "item_sub_page":
            product = self._product()
            texts = ["Instruction:", instr, BACK_TO_SEARCH, PREV_PAGE]
            if self.sub_page == "Description":
                texts.append(product["Description"])
            elif self.sub_page == "Features":
                texts.extend(product["BulletPoints"])
            elif self.sub_page == "Reviews":
                for review in product["Reviews"]:
                    texts += [f'"{review.get("title", "")}"', str(review.get("score", "")), review.get("body", "")]
            elif self.sub_page == "Attributes":
                texts.extend(product["Attributes"])
                texts += [product["category"], product["query"], product["product_category"]]
        else:  # done: WebShop's thank-you page (its hidden details are text too)
            texts = [
                "Thank you for shopping with us!",
                "Your code:",
                "None",
                "(Paste it in your MTurk interface.)",
                "Purchased",
                "asin",
                self.asin or "",
                "options",
                json.dumps(self.options),
                "attrs",
                "None",
                "category",
                "None",
                "query",
                "None",
                "product category",
                "None",
                "Target",
                "asin",
                "options",
                "attrs",
                "price upper",
                "instuction text",
                "category",
                "product category",
                "query",
                "Goal",
                "None",
                "Reward",
                "Your score (min 0.0, max 1.0)",
                str(self.reward),
                "Reward Details",
                "None",
            ]
        return [t.strip() for t in texts if t and t.strip()]

    def observation(self) -> str:
        """The page as WebShop's text mode shows it: visible text joined by ' [SEP] '."""
        return SEP.join(self.page_texts())

    def _page_products(self) -> list[dict[str, Any]]:
        page = self.page or 1
        return self.results[(page - 1) * PRODUCT_WINDOW : page * PRODUCT_WINDOW]

    def clickables(self) -> dict[str, tuple[str, str | None]]:
        """Lower-cased clickable text -> (kind, option name): buttons and product links first, then option radios."""
        kind = self.page_kind
        out: dict[str, tuple[str, str | None]] = {}
        buttons: list[str] = []
        links: list[str] = []
        if kind == "index":
            buttons = ["Search"]
        elif kind == "search_results":
            buttons = [BACK_TO_SEARCH] + ([PREV_PAGE] if (self.page or 1) > 1 else []) + [NEXT_PAGE]
            links = [p["asin"] for p in self._page_products()]
        elif kind == "item_page":
            buttons = [BACK_TO_SEARCH, PREV_PAGE, "Description", "Features", "Reviews", END_BUTTON]
        elif kind == "item_sub_page":
            buttons = [BACK_TO_SEARCH, PREV_PAGE]
        for b in buttons:
            out[b.lower()] = ("button", None)
        for a in links:
            out[a.lower()] = ("product", None)
        if kind == "item_page":
            for option_name, values in self._product()["options"].items():
                for value in values:
                    out[value] = ("option", option_name)  # a repeated value keeps its first place, last meaning
        return out

    def available_actions(self) -> dict[str, Any]:
        """WebShop's get_available_actions: whether there is a search bar, and the clickables in page order."""
        return {"has_search_bar": self.page_kind == "index", "clickables": list(self.clickables())}

    # -- actions ------------------------------------------------------------------------------------------------

    def step(self, action: str) -> tuple[str, float, bool]:
        """Apply `search[...]` or `click[...]` as WebShop's text env does; returns (observation, reward, done)."""
        if self.done:
            return self.observation(), 0.0, True
        clickables = self.clickables()
        name, arg = parse_action(action)
        if arg is not None:
            arg = arg.lower()
        reward = 0.0
        if name == "search" and arg is not None and arg != "":
            self._search(arg.split(" "), page=1)
        elif name == "click" and arg is not None and arg in clickables and arg != "search":
            reward = self._click(arg, clickables[arg])
        return self.observation(), reward, self.done

    def _search(self, keywords: list[str], page: int) -> None:
        self.page_kind = "search_results"
        self.sub_page = None
        self.page = page
        self.keywords = keywords
        self.asin = None
        self.options = {}
        self.results = top_products(self.shop, keywords, self.rng)

    def _click(self, name: str, clickable: tuple[str, str | None]) -> float:
        kind = self.page_kind
        if name == END_BUTTON.lower():
            product = self._product()
            price = self.shop.prices.get(product["asin"])
            self.reward, self.reward_info = get_reward(
                product, self.goal, price=price, options=self.options, nouns=self.shop.nouns
            )
            self.page_kind = "done"
            self.done = True
            return self.reward
        if name == BACK_TO_SEARCH.lower():
            self._reset_session()
        elif name == NEXT_PAGE.lower() and kind == "search_results":
            self._search(self.keywords or [], page=(self.page or 1) + 1)
        elif name == PREV_PAGE.lower() and kind == "search_results":
            self._search(self.keywords or [], page=(self.page or 1) - 1)
        elif name == PREV_PAGE.lower() and kind == "item_sub_page":
            self.page_kind, self.sub_page = "item_page", None
        elif name == PREV_PAGE.lower() and kind == "item_page":
            self._search(self.keywords or [], page=self.page or 1)
        elif name in [s.lower() for s in SUB_PAGES]:
            self.page_kind = "item_sub_page"
            self.sub_page = next(s for s in SUB_PAGES if s.lower() == name)
        else:
            what, option_name = clickable
            if what == "product":
                self.asin = name.upper()
                self.asins.add(self.asin)
            elif what == "option":
                self.options[option_name] = name  # type: ignore[index]
            self.page_kind, self.sub_page = "item_page", None
        return 0.0
