"""The static skill library (`--analyzer static:FILE`): keyed by an environment's categories."""

import json

import pytest

from seedcli.envs import get_env
from seedcli.errors import UserError
from seedcli.rl.skill_library import SkillCategories, load_skill_library
from seedcli.stages.rl import skill_categories

ALFWORLD_TYPES = ("pick", "look", "clean", "heat", "cool", "pick_two")
ALFWORLD = skill_categories("alfworld")  # what the rl stage hands the library for --env alfworld


def test_shipped_static_library_covers_every_task_type():
    from seedcli.stages.rl import DEFAULT_STATIC_SKILLS

    lib = load_skill_library(DEFAULT_STATIC_SKILLS, ALFWORLD)
    assert set(lib.skills) == set(ALFWORLD_TYPES) == set(get_env("alfworld").categories)
    assert all(len(v) == 1 and len(v[0].split()) >= 5 for v in lib.skills.values())
    # the long folder prefix and the short category name find the same skill
    assert lib.skill_for("pick_clean_then_place_in_recep", "e1").startswith("Find and take the object")
    assert lib.skill_for("clean", "e1") == lib.skill_for("pick_clean_then_place_in_recep", "e1")


def test_library_formats(tmp_path):
    skill = "Take the object and then put it in the target."
    p = tmp_path / "map.json"
    p.write_text(json.dumps({"pick": skill, "look_at_obj_in_light": [skill, skill + " Also look."]}))
    lib = load_skill_library(p, ALFWORLD)
    assert lib.skills["pick"] == [skill]
    assert len(lib.skills["look"]) == 2
    picks = {lib.skill_for("look", f"ep{i}") for i in range(20)}
    assert len(picks) == 2  # several skills of a type: each episode gets one, stably
    assert lib.skill_for("look", "ep3") == lib.skill_for("look_at_obj_in_light", "ep3")
    assert lib.skill_for("pick_two", "ep1") is None

    p = tmp_path / "list.json"
    p.write_text(json.dumps([{"task_type": "heat", "skill": skill}, {"category": "cool", "skill": skill}]))
    assert load_skill_library(p, ALFWORLD).skills == {"heat": [skill], "cool": [skill]}

    # an annotate run's skills.jsonl (schema 1 `task_type` or schema 2 `category`): rejected records are skipped
    p = tmp_path / "skills.jsonl"
    p.write_text(
        json.dumps({"task_type": "pick_cool_then_place_in_recep", "episode_skill": skill, "reason": None}) + "\n"
        + json.dumps({"category": "cool", "episode_skill": "x", "reason": "skill_too_short"}) + "\n"
    )  # fmt: skip
    assert load_skill_library(p, ALFWORLD).skills == {"cool": [skill]}
    assert load_skill_library(tmp_path, ALFWORLD).skills == {"cool": [skill]}  # the run directory


def test_library_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_skill_library(tmp_path / "nope.json", ALFWORLD)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"juggle": "Take the object and then put it down."}))
    with pytest.raises(UserError, match="unknown task type 'juggle' for ALFWorld; use one of pick, look"):
        load_skill_library(p, ALFWORLD)
    p.write_text(json.dumps({"pick": "too short"}))
    with pytest.raises(UserError, match="at least 5 words"):
        load_skill_library(p, ALFWORLD)
    p.write_text("{not json\n")
    with pytest.raises(UserError, match="bad.json:1"):
        load_skill_library(p, ALFWORLD)
    with pytest.raises(UserError, match="unknown environment 'nowhere'"):
        load_skill_library(p, skill_categories("nowhere"))


def test_the_library_sees_only_the_categories_it_is_handed(tmp_path):
    """No environment inside: the names the stage's mapping knows are accepted, and the error words are its own."""
    p = tmp_path / "lib.json"
    skill = "Open every drawer before you search the shelves."
    p.write_text(json.dumps({"Drawers": skill}))
    categories = SkillCategories(
        lambda name: {"drawers": "drawer"}.get(name.lower()), ("drawer",), "room", "the test house"
    )
    lib = load_skill_library(p, categories)
    assert lib.skills == {"drawer": [skill]}
    assert lib.skill_for("drawers", "e1") == lib.skill_for("drawer", "e1") == skill
    with pytest.raises(UserError, match="unknown room 'Drawers' for the test house; use one of drawer"):
        load_skill_library(p, SkillCategories({}.get, ("drawer",), "room", "the test house"))


@pytest.mark.parametrize("name", ["alfworld", "webshop", "search"])
def test_shipped_library_of_every_env_covers_its_training_categories(name):
    from seedcli.rl.skill_library import default_library_path

    env = get_env(name)
    lib = load_skill_library(default_library_path(name), skill_categories(name))
    train = {t.category for t in env.list_tasks(env.train_split)}
    assert train <= set(lib.skills), f"categories without a static skill: {train - set(lib.skills)}"
