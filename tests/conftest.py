"""Shared pytest fixtures; model fixtures live in ``tests/fixtures_models.py``.

Tests run with one torch intra-op thread: the suite starts generator, learner and vLLM processes
on 2-core machines, where oversubscribed threads made single steps 10-100x slower.
"""

import os

import pytest
import torch

from fixtures_models import tiny_model
from kube_control_plane import kube, kube_ns, kube_tenant

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

__all__ = ["kube", "kube_ns", "kube_tenant", "tiny_model"]


@pytest.fixture(autouse=True)
def _fresh_world():
    """Forget the process's ``World`` after each test (``posttrain.parallel.world`` caches it).

    Helpers such as ``runners.common.prepare`` (which the bench studies call) create it outside ``run()``'s
    ``shutdown_world``; a later test of ``init_world`` then got the cached CPU world and never checked its device.
    """
    yield
    from posttrain.parallel.world import shutdown_world

    shutdown_world()
