"""SWE-style repository repair: tasks, tools and grader, workspaces, and the environment.

Modules: ``tasks`` (task directories), ``tools`` (the agent's tools and the grader), ``workspace``
(where the repository copy lives), ``env`` (episodes).

``SWEEnvironment()`` runs the tasks shipped under ``posttrain/envs/swe/tasks/``; ``load_swe_tasks()``
returns them as ``records.Task``.
"""

from posttrain.envs.swe.env import SWEEnvironment, SWEEpisode, SWELimits
from posttrain.envs.swe.tasks import SWETaskError, load_swe_tasks
from posttrain.envs.swe.workspace import LocalSandboxBackend, SandboxBackend

__all__ = [
    "LocalSandboxBackend",
    "SWEEnvironment",
    "SWEEpisode",
    "SWELimits",
    "SWETaskError",
    "SandboxBackend",
    "load_swe_tasks",
]
