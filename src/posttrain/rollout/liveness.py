"""Generator liveness: each generator renews a heartbeat key with a TTL; the learner reads who is alive.

A generator runs a ``Heartbeat`` thread from the moment it has reached Redis until it stops: every
``ttl_s / 4`` seconds (at most 1 s) it calls ``beat``, which sets ``<prefix>:<run>:alive:<generator
id>`` with a TTL of ``generator.heartbeat_ttl_s`` and adds the id to the run's ``generators`` set. A
thread, not a task on the event loop, so a long synchronous engine start (vLLM) does not look like
death. A generator that is SIGKILLed or exits stops renewing it, and the key lapses within the TTL. On a clean stop it deletes its key (``farewell``).
The learner reads ``live_generators`` while it waits for rollouts: it returns the dead ones'
admission tickets at once (``RedisAdmissionController.return_leases_of_dead``) and stops the run
after ``learner.no_generator_timeout_s`` with none alive (``posttrain.learner.liveness``).

Guarantees: a generator counts as alive only while its key exists, so liveness lapses at most
``heartbeat_ttl_s`` after its process died. Not guaranteed: liveness means the process runs, not
that it makes progress (a generator blocked on its weight store stays alive until
``weights_timeout_s`` ends it); a Redis outage longer than the TTL makes live generators look dead
for a moment (their tickets are returned; one extra rollout may start, counted in ``late_total``).

Example: ``beat(client, keys, "g0", ttl_s=30.0)``; ``live_generators(client, keys) == ["g0"]``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from posttrain.rollout.keys import StreamKeys

log = logging.getLogger("posttrain.generator")


def beat(client: Any, keys: StreamKeys, generator_id: str, ttl_s: float) -> None:
    """Renew ``generator_id``'s heartbeat for ``ttl_s`` seconds (> 0) and register the id (one pipeline).

    Raises:
        ValueError: ``ttl_s <= 0``.
        redis.ConnectionError: the server is unreachable (after the client's own retries).
    """
    if not ttl_s > 0:
        raise ValueError(f"ttl_s: must be > 0 seconds, got {ttl_s}")
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.heartbeat(generator_id), b"1", px=max(1, int(ttl_s * 1000)))
    pipe.sadd(keys.generators, generator_id)
    pipe.execute()


def farewell(client: Any, keys: StreamKeys, generator_id: str) -> None:
    """Delete ``generator_id``'s heartbeat at once (a clean stop), so the learner need not wait for the TTL.

    Raises:
        redis.ConnectionError: the server is unreachable.
    """
    client.delete(keys.heartbeat(generator_id))


def live_generators(client: Any, keys: StreamKeys) -> list[str]:
    """Ids of the run's generators whose heartbeat key exists now, sorted.

    Raises:
        redis.ConnectionError: the server is unreachable.
    """
    ids = sorted(g.decode() if isinstance(g, bytes) else str(g) for g in client.smembers(keys.generators))
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)
    for gid in ids:
        pipe.exists(keys.heartbeat(gid))
    return [gid for gid, alive in zip(ids, pipe.execute(), strict=True) if alive]


class Heartbeat:
    """A daemon thread that renews one generator's heartbeat until ``stop`` (module docstring).

    Args:
        client: The run's Redis (redis-py clients are thread-safe).
        keys: Key names of the run.
        generator_id: The generator's id.
        ttl_s: TTL of the key (seconds, > 0); renewed every ``min(1, ttl_s / 4)`` seconds.

    Attributes:
        beats: Renewals that reached Redis.
        misses: Renewals that failed (Redis unreachable; the role's own calls decide when to give up).

    Raises:
        ValueError: ``ttl_s <= 0``.
    """

    def __init__(self, client: Any, keys: StreamKeys, generator_id: str, ttl_s: float) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s: must be > 0 seconds, got {ttl_s}")
        self.client, self.keys, self.generator_id, self.ttl_s = client, keys, generator_id, ttl_s
        self.beats = self.misses = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat {generator_id}", daemon=True)

    def start(self) -> Heartbeat:
        """Beat once now (errors propagate: Redis must be reachable), then keep beating on the thread."""
        beat(self.client, self.keys, self.generator_id, self.ttl_s)
        self.beats += 1
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.ttl_s / 4)):
            try:
                beat(self.client, self.keys, self.generator_id, self.ttl_s)
                self.beats += 1
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.misses += 1
                if self.misses == 1:
                    log.warning("generator %s: heartbeat not renewed (Redis unreachable: %s)", self.generator_id, exc)

    def stop(self, say_farewell: bool = True) -> None:
        """Stop the thread (waits at most one interval) and, with ``say_farewell``, delete the key at once.

        Raises:
            redis.ConnectionError: the farewell could not reach Redis.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        if say_farewell:
            farewell(self.client, self.keys, self.generator_id)
