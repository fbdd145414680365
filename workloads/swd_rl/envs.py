"""swd_rl: the environments — gymnasium's own tasks, and the DeepMind Control Suite through shimmy.

A DMC task is named by the gymnasium id that shimmy registers for it, `dm_control/<domain>-<task>-v0`
(e.g. `dm_control/humanoid-run-v0`): gymnasium builds it through shimmy's `DmControlCompatibilityV0`,
and its dict of observations is flattened into one vector (gymnasium's `FlattenObservation`, in
the order of the observation space's keys) so that the learners see a flat Box as on any other
task. Its actions already lie in [-1, 1]; its episodes end at the suite's own time limit (1,000
control steps), reported as truncation. Nothing here renders: dm_control picks an OpenGL backend
when it is imported, and on a machine without a display only its warning about that is silenced.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import re
import warnings
from collections.abc import Iterator
from typing import Any

DMC_PREFIX = "dm_control/"
DMC_ID = re.compile(r"dm_control/([A-Za-z0-9_]+)-([A-Za-z0-9_]+)-v0")
DMC_INSTALL = 'pip install -e ".[mujoco]"'
"""The fix when dm_control or shimmy is missing: the `mujoco` extra holds both."""


def dmc_task(env_id: str) -> tuple[str, str] | None:
    """(domain, task) of a `dm_control/<domain>-<task>-v0` id; None for any other gymnasium id.
    A malformed id under the `dm_control/` namespace is a ValueError naming the form."""
    if not env_id.startswith(DMC_PREFIX):
        return None
    match = DMC_ID.fullmatch(env_id)
    if match is None:
        raise ValueError(f"env_id={env_id!r}: a DeepMind Control Suite task is named 'dm_control/<domain>-<task>-v0', "
                         "e.g. 'dm_control/humanoid-run-v0' or 'dm_control/walker-walk-v0'")
    return match.group(1), match.group(2)


def dmc_installed() -> bool:
    return importlib.util.find_spec("dm_control") is not None and importlib.util.find_spec("shimmy") is not None


@contextlib.contextmanager
def _headless() -> Iterator[None]:
    # Importing dm_control initialises GLFW, which warns when there is no display; no rendering is done.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="glfw")
        yield


def dmc_tasks() -> list[tuple[str, str]]:
    """The suite's (domain, task) pairs, `dm_control.suite.ALL_TASKS` (dm_control must be installed)."""
    with _headless():
        from dm_control import suite
    return [tuple(t) for t in suite.ALL_TASKS]


def check_dmc(env_id: str) -> None:
    """This machine can build the DMC task `env_id` names: dm_control and shimmy import, and the
    suite has the task. Otherwise a ValueError naming the field, the closest valid id and the fix."""
    parsed = dmc_task(env_id)
    if parsed is None:
        return
    if not dmc_installed():
        raise ValueError(f"env_id={env_id!r} is a DeepMind Control Suite task, which needs dm_control and shimmy "
                         f"(the mujoco extra): {DMC_INSTALL}")
    domain, task = parsed
    tasks = dmc_tasks()
    if (domain, task) in tasks:
        return
    ids = [f"{DMC_PREFIX}{d}-{t}-v0" for d, t in tasks]
    hint = difflib.get_close_matches(env_id, ids, n=1, cutoff=0.0)[0]
    domains = sorted({d for d, _ in tasks})
    if domain in domains:
        where = f"domain {domain!r} has no task {task!r} (its tasks: {', '.join(t for d, t in tasks if d == domain)})"
    else:
        where = f"the suite has no domain {domain!r} (domains: {', '.join(domains)})"
    raise ValueError(f"env_id={env_id!r} is not a DeepMind Control Suite task: {where}; did you mean {hint!r}? "
                     "env_id takes 'dm_control/<domain>-<task>-v0' for any pair of dm_control.suite.ALL_TASKS")


def make_env(env_id: str, action_repeat: int = 1) -> Any:
    """The gymnasium environment of `env_id` (a DMC one flattened to a vector observation), each
    action repeated `action_repeat` times with the rewards summed."""
    import gymnasium as gym

    if dmc_task(env_id) is not None:
        with _headless():
            importlib.import_module("shimmy")  # importing it registers the dm_control/... ids with gymnasium
        env = gym.wrappers.FlattenObservation(gym.make(env_id))
    else:
        env = gym.make(env_id)
    if action_repeat > 1:
        env = gym.wrappers.RepeatAction(env, action_repeat)
    return env
