"""WebShop's text pages and actions, the protocol adapter, the expert and the random policy."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from seedcli.envs.base import Task
from seedcli.envs.webshop.env import WebShopEnv
from seedcli.envs.webshop.expert import expert_action
from seedcli.envs.webshop.game import WebShopSession
from seedcli.envs.webshop.projection import project_action
from seedcli.envs.webshop.prompt import format_observation
from seedcli.errors import UserError


@pytest.fixture(scope="module")
def env(shop):
    return WebShopEnv()


# -- pages and actions ---------------------------------------------------------------------------------------------


def test_search_page_then_results_then_item(shop):
    s = WebShopSession(shop)
    goal = shop.goals[0]
    instr = goal["instruction_text"]
    assert s.reset(0) == f"WebShop [SEP] Instruction: [SEP] {instr} [SEP] Search"
    assert s.available_actions() == {"has_search_bar": True, "clickables": ["search"]}

    obs, reward, done = s.step(f"search[{instr}]")
    assert (reward, done) == (0.0, False)
    assert obs.startswith(
        f"Instruction: [SEP] {instr} [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next >"
    )
    clicks = s.available_actions()["clickables"]
    assert clicks[:2] == ["back to search", "next >"] and len(clicks) == 12  # 2 buttons, 10 products
    first = s.results[0]
    assert f" [SEP] {first['asin']} [SEP] {first['Title'].strip()} [SEP] {first['Price']}" in obs

    obs, _, _ = s.step("click[next >]")
    assert "Page 2 (Total results: 50) [SEP] < Prev [SEP] Next >" in obs
    assert s.available_actions()["clickables"][:3] == ["back to search", "< prev", "next >"]
    s.step("click[< prev]")
    assert s.page == 1

    asin = goal["asin"].lower()
    assert asin in s.available_actions()["clickables"]  # the goal product is on page 1 for this goal
    obs, _, _ = s.step(f"click[{asin}]")
    product = shop.product_by_asin[goal["asin"]]
    assert (
        f"Price: {product['Price']} [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
        in obs
    )
    clicks = s.available_actions()["clickables"]
    assert clicks[:6] == ["back to search", "< prev", "description", "features", "reviews", "buy now"]
    assert set(clicks[6:]) == {v for vs in product["options"].values() for v in vs}


def test_sub_pages_and_options(shop):
    s = WebShopSession(shop)
    goal = shop.goals[0]
    s.reset(0)
    s.step(f"search[{goal['instruction_text']}]")
    s.step(f"click[{goal['asin'].lower()}]")
    product = shop.product_by_asin[goal["asin"]]
    obs, _, _ = s.step("click[Features]")  # clicks are lower-cased before matching
    assert obs.endswith(" [SEP] ".join(b.strip() for b in product["BulletPoints"] if b.strip()))
    assert s.available_actions()["clickables"] == ["back to search", "< prev"]
    s.step("click[< prev]")
    assert s.page_kind == "item_page"
    color = goal["goal_options"]["color"]
    s.step(f"click[{color}]")
    assert s.options == {"color": color}


def test_unavailable_actions_leave_the_page_unchanged(shop):
    s = WebShopSession(shop)
    start = s.reset(3)
    for action in ("click[search]", "click[buy now]", "click[next >]", "buy it", "search[]", "click[b000000000]"):
        assert s.step(action) == (start, 0.0, False)
    results, _, _ = s.step("search[shoes]")
    assert s.step("click[buy now]") == (results, 0.0, False)
    assert s.step("click[description]") == (results, 0.0, False)


def test_back_to_search_resets_the_session(shop):
    s = WebShopSession(shop)
    start = s.reset(1)
    s.step("search[shoes]")
    assert s.step("click[back to search]")[0] == start
    assert s.keywords is None and s.options == {}


def test_buying_ends_the_episode_with_the_reward(shop):
    s = WebShopSession(shop)
    s.reset(0)
    while not s.done:
        s.step(expert_action(s))
    assert s.reward == 1.0 and s.reward_info["r_option"] == 1.0
    assert s.observation().startswith("Thank you for shopping with us!")
    assert s.step("click[back to search]") == (s.observation(), 0.0, True)


# -- protocol ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "action", "valid"),
    [
        ("<think>go</think><action>click[Buy Now]</action>", "click[buy now]", True),
        ("<think>go</think> <action> search[red shoes] </action> trailing", "search[red shoes]", True),
        ("<action>click[buy now]</action>", "click[buy now]", False),  # no <think> tags
        ("<think>go</think>click[buy now]", "think>click[buy now]", False),  # no action tags: last 20 characters
        ("<think>买</think><action>click[buy now]</action>", "click[buy now]", False),  # CJK character
        ("<THINK>x</THINK><ACTION>click[next >]</ACTION>", "click[next >]", False),  # think check is case-sensitive
    ],
)
def test_parser_is_verl_agents_projection(reply, action, valid):
    assert project_action(reply) == (action, valid)


def test_format_observation_quotes_the_pieces_after_the_task():
    raw = "Instruction: [SEP] buy shoes [SEP] Back to Search [SEP] Page 1 (Total results: 3)"
    assert format_observation(raw, "buy shoes") == "'Back to Search' [SEP] 'Page 1 (Total results: 3)'"
    assert format_observation("Thank you", "buy shoes") == "Thank you"


def test_protocol_constants(env):
    assert (env.max_steps, env.history, env.success_reward, env.invalid_penalty) == (15, 2, 10.0, 0.1)
    assert env.advantage_norm == "mean"
    assert env.card.paper_results["test"]["SEED"] == {"mean_score": 0.885, "micro_success": 0.789}
    assert "WebShop" in env.analysis_description and "ALFRED" not in env.analysis_description


def test_tasks_games_and_prompt(env):
    tasks = env.list_tasks("test")
    assert len(tasks) == 500 and len(env.list_tasks("train")) == 6410
    assert tasks[0].task_id == "goal-0" and tasks[0].category in env.categories
    game = env.new_game(expert=True)
    first = game.reset(tasks[0])
    assert first.observation == "'Search'" and first.admissible == ["search[<your query>]", "click[search]"]
    assert first.expert_action.startswith("search[")
    prompt = env.render_prompt(first.task, first.observation, first.admissible, 1, [], env.history)
    assert f"Your task is to: {first.task}.\n" in prompt
    assert "'search[<your query>]',\n'click[search]',\n]" in prompt
    with_skill = env.insert_skill(prompt, "Search with the instruction's words.")
    assert with_skill.index("Search with the instruction's words.") > with_skill.index("Your task is to:")

    history = []
    result = first
    for _ in range(env.max_steps):
        action, valid = env.parse_action(env.expert_response(result))
        assert valid
        history.append((result.observation, action))
        result = game.step(action)
        if result.done:
            break
    assert result.won and result.score == 1.0 and result.reward == 1.0 and result.admissible == []
    prompt = env.render_prompt(result.task, "'x'", ["click[a]"], len(history) + 1, history, 2)
    assert f"already taken {len(history)} step(s). Below are the most recent 2 observations" in prompt
    assert f"[Observation {len(history)}: '{history[-1][0]}', Action {len(history)}: '{history[-1][1]}']" in prompt
    assert f"[Observation {len(history) - 2}:" not in prompt


def test_bad_input_is_a_one_line_error(env, tmp_path):
    with pytest.raises(UserError, match="unknown WebShop split"):
        env.list_tasks("dev")
    game = env.new_game()
    for bad in ("goal-6910", "goal-x", "trial_1"):
        with pytest.raises(UserError, match="unknown WebShop task") as err:
            game.reset(Task(bad, "fashion", "test"))
        assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="WebShop data not found"):
        WebShopEnv(data_root=str(tmp_path)).list_tasks("test")
    with pytest.raises(UserError, match="unknown WebShop option"):
        WebShopEnv(colour="red")


# -- policies -------------------------------------------------------------------------------------------------------


def test_expert_on_the_500_test_goals(shop):
    """The ceiling this search engine allows: prints the expert's score and success."""
    s = WebShopSession(shop)
    scores, steps = [], []
    for index in shop.split_goals("test"):
        s.reset(index)
        n = 0
        while not s.done and n < 15:
            s.step(expert_action(s))
            n += 1
        scores.append(s.reward)
        steps.append(n)
    score = sum(scores) / len(scores)
    success = sum(r == 1.0 for r in scores) / len(scores)
    print(f"\nexpert on 500 test goals: score {score:.3f}, success {success:.3f}, mean steps {sum(steps) / 500:.2f}")
    assert all(n < 15 for n in steps)  # always buys within the step limit
    assert score > 0.95 and success > 0.9


def test_random_policy_loses(env):
    rng = random.Random(0)
    tasks = env.list_tasks("test")[:40]
    game = env.new_game()
    wins = 0
    for task in tasks:
        result = game.reset(task)
        for _ in range(env.max_steps):
            action, valid = env.parse_action(env.random_response(result, rng))
            assert valid and (action in result.admissible or action.startswith("search["))
            result = game.step(action)
            if result.done:
                break
        wins += result.won
    assert wins <= 2


# -- rules analyzer ------------------------------------------------------------------------------------------------


def _trajectory(task, actions, observations, won, score):
    turns = [
        SimpleNamespace(observation=o, action=a, valid=True, response="", admissible=[])
        for o, a in zip(observations, actions, strict=True)
    ]
    return SimpleNamespace(task=task, turns=turns, won=won, score=score, category="fashion", sampling={})


TASK = "Find me slim fit jeans with color: navy, and size: 32w, and price lower than 40.00 dollars"


def test_rules_skill_writes_a_workflow_from_a_success(env):
    traj = _trajectory(
        TASK,
        ["search[slim fit jeans]", "click[b012345678]", "click[navy]", "click[32w]", "click[buy now]"],
        ["'Search'", "'B012345678'", "'Price: $30.0'", "'x'", "'y'"],
        True,
        1.0,
    )
    summary, skill = env.rules_skill(traj)
    assert "search for 'slim fit jeans'" in skill and "color: navy, size: 32w" in skill and "40.00 dollars" in skill
    assert skill.endswith("click 'buy now'.")


@pytest.mark.parametrize(
    ("actions", "price", "expect"),
    [
        (["search[jeans]", "click[b012345678]", "click[next >]"], "30.0", "Do not run out of steps"),
        (["search[jeans]", "click[b012345678]", "click[navy]", "click[buy now]"], "30.0", "click every option"),
        (
            ["search[jeans]", "click[b012345678]", "click[navy]", "click[32w]", "click[buy now]"],
            "55.0",
            "Never buy a product priced at or above 40.00 dollars",
        ),
        (
            ["search[jeans]", "click[b012345678]", "click[navy]", "click[32w]", "click[buy now]"],
            "30.0",
            "Open only results whose title names",
        ),
    ],
)
def test_rules_skill_names_the_failure(env, actions, price, expect):
    observations = ["'Search'", "'results'"] + [f"'Price: ${price}'"] * (len(actions) - 2)
    summary, skill = env.rules_skill(_trajectory(TASK, actions, observations, False, 0.5))
    assert expect in skill
