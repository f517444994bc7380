"""Generator liveness: each generator renews a heartbeat key with a TTL; the learner reads who is alive.

A generator calls ``beat`` at every wake-up of its weight watcher (about once a second), which
sets ``<prefix>:<run>:alive:<generator id>`` with a TTL of ``generator.heartbeat_ttl_s`` and adds
the id to the run's ``generators`` set. A generator that is SIGKILLed, hangs or exits stops
renewing it, and the key lapses within the TTL. On a clean stop it deletes its key (``farewell``).
The learner reads ``live_generators`` while it waits for rollouts: it returns the dead ones'
admission tickets at once (``RedisAdmissionController.return_leases_of_dead``) and stops the run
after ``learner.no_generator_timeout_s`` with none alive (``posttrain.learner.liveness``).

Guarantees: a generator counts as alive only while its key exists, so liveness lapses at most
``heartbeat_ttl_s`` after its last renewal. Not guaranteed: a generator whose event loop is stuck
in a long synchronous call (a weight reload longer than the TTL) looks dead meanwhile; its
tickets are returned and it may start one rollout more than capacity (counted in ``late_total``).

Example: ``beat(client, keys, "g0", ttl_s=30.0)``; ``live_generators(client, keys) == ["g0"]``.
"""

from __future__ import annotations

from typing import Any

from posttrain.rollout.keys import StreamKeys


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
