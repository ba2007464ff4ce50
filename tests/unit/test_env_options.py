"""Env options (issue 20): each environment declares its options once (type, range, default, meaning); a bad one is a
one-line user error before anything runs, and the config keeps the options as written (hashes unchanged)."""

from __future__ import annotations

import pytest

from seedcli.config import build_config
from seedcli.envs import ENV_NAMES, env_class, get_env
from seedcli.envs.base import EnvOptions
from seedcli.errors import UserError

BAD = [
    ("search", {"topk": 0}, "topk=0: input should be greater than or equal to 1"),
    ("search", {"limit": -1}, "limit=-1: input should be greater than or equal to 1"),
    ("webshop", {"goal_seed": "abc"}, "goal_seed='abc': input should be a valid integer"),
    ("search", {"topk": "abc"}, "topk='abc': input should be a valid integer"),
    ("search", {"timeout": "abc"}, "timeout='abc': input should be a valid number"),
    ("search", {"max_retries": -1}, "max_retries=-1: input should be greater than or equal to 0"),
    ("search", {"search_url": "ftp://h"}, "is not an http"),
    ("alfworld", {"foo": 1}, "unknown ALFWorld option 'foo' in env_options (ALFWorld takes no env options)"),
    ("search", {"corpuss": "x"}, "unknown Search-QA option 'corpuss' in env_options; did you mean 'corpus'?"),
    ("search", {"topk:0": None}, "unknown Search-QA option 'topk:0'"),  # YAML's reading of `{topk:0}`
    ("webshop", {"colour": "red"}, "unknown WebShop option 'colour'"),
]


@pytest.mark.parametrize(("env", "options", "message"), BAD)
def test_bad_options_are_one_line_errors_before_anything_runs(env, options, message) -> None:
    with pytest.raises(UserError) as direct:
        get_env(env, **options)
    assert message in str(direct.value) and "\n" not in str(direct.value)
    # the config is refused as it is built: no data read, no run directory made
    with pytest.raises(UserError) as cfg:
        build_config("eval", cli={"env": env, "env_options": options, "policy": "expert"})
    assert message in str(cfg.value) and "field 'env_options'" in str(cfg.value)
    assert "Value error" not in str(cfg.value) and "\n" not in str(cfg.value)


def test_malformed_yaml_is_a_user_error() -> None:
    for text, message in (
        ("{topk: 5", "is not a YAML mapping"),
        ("[1, 2]", "is not a mapping of option names to values"),
    ):
        with pytest.raises(UserError, match=message) as err:
            build_config("collect", cli={"env": "search", "env_options": text})
        assert "\n" not in str(err.value)


def test_good_options_are_normalised_by_the_env_and_kept_as_written_in_the_config() -> None:
    env = get_env("search", datasets="nq,bamboogle", topk="5", search_url=None)
    assert env.options == {"datasets": ["nq", "bamboogle"], "topk": 5}  # None dropped, types made
    assert get_env("search", **env.spec()).options == env.options  # what a worker rebuilds
    cfg = build_config("eval", cli={"env": "search", "env_options": "{datasets: 'nq,bamboogle', topk: 5}"})
    assert cfg.env_options == {"datasets": "nq,bamboogle", "topk": 5}  # as written: the config hash is the user's
    assert get_env("webshop", goal_seed=3).goal_seed == 3


def test_every_env_declares_its_options_with_a_meaning() -> None:
    for name in ENV_NAMES:
        cls = env_class(name)
        assert issubclass(cls.options_model, EnvOptions)
        for opt, typ, _default, meaning in cls.option_specs():
            assert typ and meaning, f"{name}: option {opt} needs a type and a description"
    assert env_class("alfworld").option_specs() == []  # no declared options: any option is refused
    assert [o[0] for o in env_class("webshop").option_specs()] == ["goal_seed"]
    topk = dict((o[0], o) for o in env_class("search").option_specs())["topk"]
    assert topk[1:3] == ("int", 3)
