"""One WebShop episode slot: `WebShopGame` (the EnvGame of `env.WebShopEnv.new_game`) plays one goal in a
`game.WebShopSession`; an expert game adds the expert's next action (`expert.expert_action`). The environment hands
each slot what it reads (the shop, how a task becomes its goal index, the goal seed): a slot never imports its
environment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from seedcli.envs.base import StepResult, Task
from seedcli.envs.webshop.data import Shop
from seedcli.envs.webshop.expert import admissible_actions, expert_action
from seedcli.envs.webshop.game import WebShopSession
from seedcli.envs.webshop.prompt import format_observation
from seedcli.envs.webshop.reward import outcome


class WebShopGame:
    """One episode slot: a WebShop session on one goal; `expert` adds the expert's next action."""

    def __init__(self, shop: Shop, goal_index: Callable[[Task], int], goal_seed: int = 0, expert: bool | str = False):
        self.shop = shop
        self.goal_index = goal_index  # the goal a task names (an unknown one is a one-line UserError)
        self.expert = bool(expert)
        self.session = WebShopSession(shop, seed=goal_seed)
        self.task_text = ""

    def _result(self, raw: str, reward: float, done: bool) -> StepResult:
        s = self.session
        info: dict[str, Any] = {"goal_index": s.goal_index, "page": s.page_kind}
        if done:
            info.update(
                asin=s.asin,
                options=dict(s.options),
                goal_asin=s.goal["asin"],
                goal_options=dict(s.goal["goal_options"]),
                price_upper=s.goal["price_upper"],
                price=self.shop.prices.get(s.asin or ""),
                reward_info=dict(s.reward_info),
            )
        won, score = outcome(s.reward, done)
        return StepResult(
            observation=format_observation(raw, self.task_text),
            admissible=[] if done else admissible_actions(s),
            won=won,
            done=done,
            task=self.task_text,
            expert_action=expert_action(s) if self.expert and not done else None,
            reward=float(reward),  # the purchase reward once bought, else 0: logged; the score is the same number
            score=score,
            info=info,
        )

    def reset(self, task: Task) -> StepResult:
        index = self.goal_index(task)
        raw = self.session.reset(index)
        # verl-agent reads the task back from the page, where it is stripped
        self.task_text = self.session.instruction_text.strip()
        return self._result(raw, 0.0, False)

    def step(self, action: str) -> StepResult:
        if self.session.goal_index < 0:
            raise RuntimeError("step() before reset()")
        raw, reward, done = self.session.step(action)
        return self._result(raw, reward, done)

    def close(self) -> None:
        pass
