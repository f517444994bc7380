"""Shared pytest fixtures; model fixtures live in ``tests/fixtures_models.py``.

Tests run with one torch intra-op thread: the suite starts generator, learner and vLLM processes
on 2-core machines, where oversubscribed threads made single steps 10-100x slower.

Fixtures every test can use (each built once per test process; ``make test`` runs two processes, pytest-xdist):

* ``tiny_model`` (session): a 2-layer Qwen2-style model directory with its locally trained tokenizer
  (``fixtures_models.TinyModel``: path, vocab size, special token ids). Read it; copy it before changing files.
* ``redis_server`` (session): one embedded Valkey (``EmbeddedRedis``: ``.url``, ``.port``). Use a run name or key
  prefix of the test's own (``request.node.name``); never FLUSHALL. A test that kills or restarts the server starts
  its own ``EmbeddedRedis()``.
* ``s3_server`` (session): one SeaweedFS S3 server (``S3Server``: ``.client()``, ``.env()``) with the buckets of
  ``S3_BUCKETS``. Write under a prefix of the test's own (``s3://<bucket>/<test name>/...``); a test that needs a
  bucket of its own creates it with ``s3_server.client().create_bucket``.

Keep new fixtures here (or in ``fixtures_models.py``) rather than per module when more than one module can share them,
and keep these names and fields stable: other branches' tests use them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import torch

from fixtures_models import tiny_model
from kube_control_plane import kube, kube_ns, kube_tenant

if TYPE_CHECKING:  # imported inside the fixtures: collecting the suite starts no service code
    from posttrain.services.embedded_redis import EmbeddedRedis
    from posttrain.services.s3 import S3Server

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

__all__ = ["kube", "kube_ns", "kube_tenant", "tiny_model"]

S3_BUCKETS = ("ckpt", "ckpts", "posttrain", "runs", "weights")
"""Buckets the shared ``s3_server`` creates at start (no ``mlpipeline``: tests of a tenant store rely on its absence)."""


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    """One embedded Valkey server for the test process (started on first use)."""
    from posttrain.services.embedded_redis import EmbeddedRedis

    with EmbeddedRedis() as server:
        yield server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS S3 server for the test process (started on first use), with the buckets of ``S3_BUCKETS``;
    stopped, and checked gone, at the end of the session."""
    from posttrain.services.s3 import start_s3_server

    server = start_s3_server(tmp_path_factory.mktemp("weed"), buckets=S3_BUCKETS)
    try:
        yield server
    finally:
        server.stop()
        assert server.process.poll() is not None, "weed mini still running after stop()"


@pytest.fixture(autouse=True)
def _fresh_world():
    """Forget the process's ``World`` after each test (``posttrain.parallel.world`` caches it).

    Helpers such as ``runners.common.prepare`` (which the bench studies call) create it outside ``run()``'s
    ``shutdown_world``; a later test of ``init_world`` then got the cached CPU world and never checked its device.
    """
    yield
    from posttrain.parallel.world import shutdown_world

    shutdown_world()
