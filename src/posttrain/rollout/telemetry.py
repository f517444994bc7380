"""Generator telemetry on the run's Redis: each generator writes its stats, the learner and runner read them.

Every generator keeps one field of the hash ``StreamKeys.generator_stats``
(``<prefix>:<run>:generator_stats``): its id -> the JSON of its ``GeneratorStats.snapshot()``
(``posttrain.inference.metering``: seconds, counts, rates). It rewrites its field at every
weight check (about once a second) and when it stops. The learner logs a few of each
generator's numbers with its metrics (``generator_metrics``); ``posttrain run`` sums them into
the run summary (``generator_counters``). JSON, no pickle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from posttrain.rollout.keys import StreamKeys

LOGGED_FIELDS = (
    "busy_fraction", "rollouts_per_s", "tokens_per_s", "max_in_flight", "rejected", "failed", "stale_aborted",
    "mean_batch_rows", "infra_errors", "reissued",
)
"""Fields of each generator's stats the learner logs as ``generator/<id>/<field>``."""

SUMMED_FIELDS = ("stale_aborted", "busy_s", "wall_s", "cpu_s", "host_cpu_s", "engine_batch_cpu_s", "rollouts")
"""Fields summed over generators into the run summary's ``generator_<field>`` counters."""


def publish_generator_stats(client: Any, keys: StreamKeys, generator_id: str, snapshot: Mapping[str, float]) -> None:
    """Write one generator's stats snapshot (a flat dict of floats) into the run's telemetry hash.

    Raises:
        redis.ConnectionError: Redis unreachable.
    """
    client.hset(keys.generator_stats, generator_id, json.dumps(dict(snapshot)))


def read_generator_stats(client: Any, keys: StreamKeys) -> dict[str, dict[str, float]]:
    """Every generator's latest stats: generator id -> stats dict (empty before any generator wrote).

    Raises:
        redis.ConnectionError: Redis unreachable.
        ValueError: a field that is not JSON (the message names the generator).
    """
    out: dict[str, dict[str, float]] = {}
    for gid, blob in client.hgetall(keys.generator_stats).items():
        name = gid.decode() if isinstance(gid, bytes) else str(gid)
        out[name] = _decode(keys, name, blob)
    return out


def _decode(keys: StreamKeys, generator_id: str, blob: bytes | str) -> Any:
    """One field of the stats hash as JSON; ValueError naming the generator when it is not JSON."""
    try:
        return json.loads(blob)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{keys.generator_stats}[{generator_id}]: not JSON ({exc})") from exc


def own_generator_stats(client: Any, keys: StreamKeys, generator_id: str) -> dict[str, float]:
    """One generator's latest stats in the run's telemetry hash ({} when it wrote none: its first life).

    Raises:
        redis.ConnectionError: Redis unreachable.
        ValueError: the field is not a JSON object (the message names the generator).
    """
    blob = client.hget(keys.generator_stats, generator_id)
    if blob is None:
        return {}
    out = _decode(keys, generator_id, blob)
    if not isinstance(out, dict):
        raise ValueError(f"{keys.generator_stats}[{generator_id}]: not a JSON object")
    return out


def generator_metrics(stats: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The learner's per-iteration view of the generators: ``generator/<id>/<field>`` and the mean busy fraction."""
    out: dict[str, float] = {}
    for name, values in stats.items():
        for field in LOGGED_FIELDS:
            out[f"generator/{name}/{field}"] = float(values.get(field, 0.0))
    if stats:
        out["generator/busy_fraction_mean"] = sum(float(s.get("busy_fraction", 0.0)) for s in stats.values()) / len(stats)
    return out


def generator_counters(stats: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Run-summary counters over all generators (the mean busy and CPU fractions, maxima, sums).

    Keys: ``generator_busy_fraction`` and ``generator_cpu_fraction`` (means over generators),
    ``generator_max_in_flight`` (max), ``generator_<field>`` for every ``SUMMED_FIELDS`` entry and
    every ``stale_aborted_calls_*`` field (cancelled episodes by tool-call bucket; sums),
    and ``generator_mean_batch_rows`` (requests per engine batch over all generators' batches).
    """
    n = max(len(stats), 1)
    out = {
        "generator_busy_fraction": sum(float(s["busy_fraction"]) for s in stats.values()) / n,
        "generator_max_in_flight": float(max((s["max_in_flight"] for s in stats.values()), default=0)),
        "generator_cpu_fraction": sum(float(s.get("cpu_fraction", 0.0)) for s in stats.values()) / n,
    }
    for field in SUMMED_FIELDS:
        out[f"generator_{field}"] = float(sum(s.get(field, 0.0) for s in stats.values()))
    for field in sorted({k for s in stats.values() for k in s if k.startswith("stale_aborted_calls_")}):
        out[f"generator_{field}"] = float(sum(s.get(field, 0.0) for s in stats.values()))
    batches = sum(s.get("engine_batches", 0.0) for s in stats.values())
    rows = sum(s.get("engine_batch_rows", 0.0) for s in stats.values())
    out["generator_mean_batch_rows"] = rows / batches if batches else 0.0
    return out
