"""ALFWorld (Shridhar et al., 2021) through the `alfworld` package over TextWorld's PDDL engine.

    games.py    data root, splits, game discovery and selection, one game in this process (`AlfWorldGame`) and its
                experts (the stored walkthrough, the hand-coded searching expert)
    prompt.py   the agent's turn prompt (versioned), its parser, the analysis prompt's first sentence
    rules.py    the offline rules analyzer's ALFWorld skills
    env.py      `AlfWorldEnv`, the environment protocol; `EnvPool`, game slots in worker processes; tokenizer text

Stages reach ALFWorld as `get_env("alfworld")`; the names below stay importable from `seedcli.envs.alfworld` for the
warm start (ALFWorld's own), the tests and the scripts. Nothing here imports torch.
"""

from seedcli.envs.alfworld.env import CORPUS_SPLITS, AlfWorldEnv, EnvPool
from seedcli.envs.alfworld.games import (
    DATA_SUBDIR,
    EXPERT_MODES,
    GAME_FILE,
    SHORT_TASK_TYPES,
    SPLITS,
    TASK_TYPES,
    AlfWorldGame,
    Game,
    game_path,
    list_games,
    resolve_data_root,
    resolve_split,
    select_games,
    task_type_of,
)
from seedcli.envs.alfworld.prompt import (
    AGENT_PROMPT_VERSION,
    ALFWORLD_ANALYSIS_DESCRIPTION,
    TASK_LINE_PREFIX,
    format_response,
    insert_skill,
    parse_action,
    render_agent_prompt,
    tokenizer_corpus,
)
from seedcli.envs.base import StepResult, Task

__all__ = [
    "AGENT_PROMPT_VERSION",
    "ALFWORLD_ANALYSIS_DESCRIPTION",
    "CORPUS_SPLITS",
    "DATA_SUBDIR",
    "EXPERT_MODES",
    "GAME_FILE",
    "SHORT_TASK_TYPES",
    "SPLITS",
    "TASK_LINE_PREFIX",
    "TASK_TYPES",
    "AlfWorldEnv",
    "AlfWorldGame",
    "EnvPool",
    "Game",
    "StepResult",
    "Task",
    "format_response",
    "game_path",
    "insert_skill",
    "list_games",
    "parse_action",
    "render_agent_prompt",
    "resolve_data_root",
    "resolve_split",
    "select_games",
    "task_type_of",
    "tokenizer_corpus",
]
