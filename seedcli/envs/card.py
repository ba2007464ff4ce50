"""An environment's card: what reports, `seed envs` and eval's summary say about it, apart from how it is played.

    card = env_class("webshop").card
    card.metric_labels      # {"mean_score": "score", "micro_success": "success"}: results.json keys, headline first
    card.paper_results      # split -> method -> metric key -> fraction (the paper's table)

Every environment declares one (`Environment.card`). Nothing a game, a prompt, a reward or a config hash depends on
is here (the protocol, `seedcli.envs.base.Environment`, holds that); the one reader outside reports and eval's
summary is search's rules analyzer, which names a question's data source by its display name.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EnvCard:
    """The report copy of one environment: its words for a task and a category, its metrics' labels, the paper's
    numbers and the notes printed under them."""

    metric_labels: dict[str, str]  # results.json key -> label; the first is the headline
    task_noun: str = "task"  # what a task is called in reports: "game", "goal", "question"
    category_label: str = "category"  # what a category is called in reports: "task type"
    category_names: dict[str, str] = field(default_factory=dict)  # category -> display name
    paper_model: str = "Qwen2.5-3B"
    paper_results: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # split -> method -> key
    paper_note: str = ""  # a line under the paper table (where the numbers come from, what is missing)
    offline_note: str = ""  # a line in every report on how offline data differs from the paper's

    def category_name(self, category: str) -> str:
        """Display name of a category in reports (and in the rules analyzer's search skills)."""
        return self.category_names.get(category, category.replace("_", " ").title())
