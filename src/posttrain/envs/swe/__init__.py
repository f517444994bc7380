"""SWE-style repository repair: tasks (``tasks``), tools and grader (``tools``), environment (``env``).

``SWEEnvironment()`` runs the tasks shipped under ``posttrain/envs/swe/tasks/``; ``load_swe_tasks()``
returns them as ``records.Task``.
"""

from posttrain.envs.swe.env import LocalSandboxBackend, SandboxBackend, SWEEnvironment, SWEEpisode, SWELimits
from posttrain.envs.swe.tasks import SWETaskError, load_swe_tasks

__all__ = [
    "LocalSandboxBackend",
    "SWEEnvironment",
    "SWEEpisode",
    "SWELimits",
    "SWETaskError",
    "SandboxBackend",
    "load_swe_tasks",
]
