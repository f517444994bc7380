"""Fixtures of the transport contract suites: one embedded Valkey server for the whole session.

The server starts only when a Redis-backed case runs (``-m "not integration"`` never starts it);
every case uses its own run name, so keys never collide.
"""

from __future__ import annotations

import pytest

from posttrain.services.embedded_redis import EmbeddedRedis


@pytest.fixture(scope="session")
def redis_server():
    with EmbeddedRedis() as server:
        yield server
