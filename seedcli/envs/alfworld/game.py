"""ALFWorld's game engine: TextWorld's PDDL environment over an ALFRED game file (the `alfworld` 0.4.2 package), as
one episode slot builds it (`episode.AlfWorldGame`), with the pure, slow parts of the engine memoised.

textworld, fast_downward and alfworld are imported lazily, after ALFWORLD_DATA is set (`data.resolve_data_root`);
this module never imports torch.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import sys
from collections import OrderedDict

from seedcli.envs.alfworld.data import resolve_data_root

BANNER = "-= Welcome to TextWorld, ALFRED! =-"  # heads the first observation of every game; the agent never sees it
TASK_RE = re.compile(r"Your task is to:\s*(.*)")  # the task line of the first observation


def build_env(data_root: str | os.PathLike | None, facts: bool):
    """A TextWorld environment for ALFRED games (load a game file, then reset and step it). `facts`: its states carry
    the PDDL facts, which the hand-coded expert reads; everything else needs only `won` and the admissible commands."""
    resolve_data_root(data_root)  # sets ALFWORLD_DATA before alfworld is imported
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs.pddl import PddlEnv

    _install_speedups()
    infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=facts)
    # shuffle=False: object numbers as in the stored walkthrough and ALFWorld's eval (no domain randomisation).
    return AlfredDemangler(shuffle=False)(PddlEnv(infos))


_translations: OrderedDict[bytes, tuple] = OrderedDict()
_TRANSLATION_CACHE_SIZE = 24  # ~2 MB of SAS text each: a worker keeps the games of its recent groups
_parsed_templates: dict[tuple[str, str | None], list] = {}
_parsed_queries: dict[str, object] = {}
_PARSE_CACHE_SIZE = 50_000  # small entries; cleared when full (a long run meets many games' grammars)


def _install_speedups() -> None:
    """Memoise the pure, slow parts of TextWorld's PDDL engine, process-wide (outputs are unchanged; checked by
    replaying games with and without). Idempotent.

    - Fast Downward's PDDL->SAS translation, the bulk of a reset (1-3 s a game here). PddlEnv translates each game
      four times per start (at load and again at reset, each plain and "optimised for replanning"); one plain
      translation now serves all four and later resets of the same game. The replanning copy only feeds the
      optimal planner, which this module never calls (an unoptimised task is still a valid planning task).
    - The text grammar's template and condition parsing (tatsu), repeated for every admissible command at every
      step: steps get about 3x faster (90 -> 30 ms here)."""
    import fast_downward
    import textworld.envs.pddl.textgen as textgen
    from textworld.logic import Rule

    if getattr(fast_downward.pddl2sas, "_seedcli_cached", False):
        return
    original_pddl2sas = fast_downward.pddl2sas

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        key = hashlib.sha1(domain.encode() + b"\0" + problem.encode()).digest()
        hit = _translations.get(key)
        if hit is None:
            argv = list(sys.argv)  # the translator overwrites sys.argv with its own; give the caller theirs back
            try:
                hit = original_pddl2sas(domain, problem, verbose=verbose, optimize=False)
            finally:
                sys.argv[:] = argv
            _translations[key] = hit
            while len(_translations) > _TRANSLATION_CACHE_SIZE:
                _translations.popitem(last=False)
        else:
            _translations.move_to_end(key)
        return hit

    original_parse = textgen._parse_and_convert

    def parse_and_convert(text, rule_name=None, **kwargs):
        if kwargs.get("trace"):
            return original_parse(text, rule_name=rule_name, **kwargs)
        key = (text, rule_name)
        symbols = _parsed_templates.get(key)
        if symbols is None:
            if len(_parsed_templates) >= _PARSE_CACHE_SIZE:
                _parsed_templates.clear()
            symbols = _parsed_templates[key] = original_parse(text, rule_name=rule_name)
        return copy.deepcopy(symbols)  # the grammar writes contexts into the symbols it gets

    original_query = Rule.parse_conjunctive_query.__func__

    def parse_conjunctive_query(cls, expr: str):
        rule = _parsed_queries.get(expr)
        if rule is None:
            if len(_parsed_queries) >= _PARSE_CACHE_SIZE:
                _parsed_queries.clear()
            rule = _parsed_queries[expr] = original_query(cls, expr)
        return rule  # only read (matched against the state)

    pddl2sas._seedcli_cached = True  # type: ignore[attr-defined]
    fast_downward.pddl2sas = pddl2sas
    textgen._parse_and_convert = parse_and_convert
    Rule.parse_conjunctive_query = classmethod(parse_conjunctive_query)
