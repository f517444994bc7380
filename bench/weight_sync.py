"""Weight-sync latency: a learner's publish until a generator serves the new version, against raw safetensors I/O.

For each model shape (random weights; ``tiny`` and a Qwen2-0.5B-shaped model: vocabulary
151,936, hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4,864, tied embeddings, float32 as the
CPU learner publishes it) and ``--repeats`` versions:

* **ours** = the learner's publish sequence (``posttrain.learner.publish``):
  ``FilesystemWeightStore.publish`` (copy the tensors, safetensors write, fsync, rename,
  ``LATEST``), ``RedisPolicyVersionStore.set`` and ``announce_weights`` (Redis pub/sub), then, in
  a separate generator process, the generator's watch loop (``posttrain.generator.watcher``):
  ``WeightAnnouncements.wait`` wakes on the announcement (or after ``WEIGHT_WAIT_S``), reads the
  store's ``LATEST`` and the version directory's stamp, and ``update_weights`` of the ``hf``
  engine (``load_file`` and ``load_state_dict`` in place). The clock runs from the start of
  ``publish`` in the learner process to the end of ``update_weights`` in the generator process
  (``time.time()``, one machine). The generator process runs the same calls in the same order
  as the worker's watcher, without episodes; with ``--vllm`` the vLLM engine's reload is also
  timed in-process;
* **raw** = ``safetensors.torch.save_file`` of the same tensors + fsync, then ``load_file`` with
  every tensor copied into memory (``load_file`` alone only maps the file), nothing else.

The two run alternately (raw first on odd versions, ours first on even ones).

The table reports medians in seconds: publish (``store.publish``), detection (publish done ->
the generator has read ``LATEST``: version key, announcement, wake-up), the generator's reload,
end to end (their sum per version), and
``ratio = ours / raw`` end to end and without detection; ``worst_ratio_over_raw`` (over shapes,
end to end) is the number the target (at most 2x) is checked against. Writes
``bench/results/weight_sync.json`` and the ``weight_sync`` section of docs/benchmarks.md.

Run: ``.venv/bin/python -m bench.weight_sync`` (about 3 minutes on 2 cores, mostly the 2 GB
float32 writes of the 0.5B shape), ``.venv/bin/python -m bench.weight_sync --shapes tiny --vllm``
(adds the vLLM engine's reload; about a minute of vLLM start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    command_line,
    machine_info,
    machine_line,
    markdown_table,
    publish_result,
)

SERVED_KEY = "served"
"""Redis list (under the bench run's keys) where the generator process reports each version it serves."""

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"vocab_size": 1024, "hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
             "intermediate_size": 256, "tie_word_embeddings": False},
    "qwen2-0.5b": {"vocab_size": 151936, "hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2,
                   "intermediate_size": 4864, "tie_word_embeddings": True},
}
"""Model shapes measured (``build_tiny_model`` arguments)."""


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


async def _serve_versions(model_dir: Path, store_dir: Path, redis_url: str, run: str) -> None:
    """The generator side: the watch loop of ``posttrain.generator.watcher`` around an ``hf`` engine.

    Same calls in the same order as the worker's watcher: read ``LATEST`` and the version
    directory's stamp, reload when the stamp changed, check the stop key, then
    ``WeightAnnouncements.wait(WEIGHT_WAIT_S)``. After each reload it pushes
    ``detected_at served_at version`` (unix seconds) to the bench's ``served`` list.
    """
    import redis

    from posttrain.generator.watcher import WEIGHT_WAIT_S
    from posttrain.inference.hf import HFEngine
    from posttrain.rollout.keys import StreamKeys
    from posttrain.weight_sync.announce import WeightAnnouncements
    from posttrain.weight_sync.store import FilesystemWeightStore

    keys = StreamKeys("bench", run)
    client = redis.Redis.from_url(redis_url)
    store = FilesystemWeightStore(store_dir)
    engine = HFEngine(model_dir)
    announcements = WeightAnnouncements(redis_url, keys)
    await announcements.subscribe()

    def stamp(version: int) -> tuple[int, int]:
        return version, store.path_for(version).stat().st_mtime_ns

    latest = store.latest_version()
    served = stamp(latest) if latest is not None else (-1, 0)
    client.rpush(f"{keys.base}:{SERVED_KEY}", b"ready")
    try:
        while True:
            latest = store.latest_version()
            detected_at = time.time()
            if latest is not None:
                try:
                    current = stamp(latest)
                except FileNotFoundError:  # pruned or being replaced: look again at the next wake-up
                    current = served
                if current != served:
                    await engine.update_weights(store.path_for(latest), latest)
                    served = current
                    client.rpush(f"{keys.base}:{SERVED_KEY}", f"{detected_at} {time.time()} {latest}".encode())
            if client.exists(f"{keys.base}:stop"):
                break
            await announcements.wait(WEIGHT_WAIT_S)
    finally:
        await announcements.close()
        engine.close()
        client.close()


def measure_shape(name: str, shape: dict[str, Any], repeats: int, vllm: bool, tmp: Path, redis_url: str) -> dict[str, Any]:
    """Medians (seconds) of raw write/read and of publish, detection and reload for one shape.

    Raises:
        RuntimeError: ``vllm`` is set but vLLM does not import, or the generator process did not
            report a version within 300 s (its log is in the message).
    """
    import subprocess
    import uuid

    import redis
    import torch
    from safetensors.torch import load_file, save_file

    from posttrain.generator.watcher import WEIGHT_WAIT_S
    from posttrain.models.hf import build_tiny_model, load_policy
    from posttrain.rollout.keys import StreamKeys
    from posttrain.rollout.redis_streams import RedisPolicyVersionStore
    from posttrain.weight_sync.announce import announce_weights
    from posttrain.weight_sync.store import FilesystemWeightStore, prepare_state_dict

    model_dir = build_tiny_model(tmp / name / "model", **shape)
    model = load_policy(model_dir)
    params = sum(p.numel() for p in model.parameters())
    store = FilesystemWeightStore(tmp / name / "store")
    raw_path = tmp / name / "raw.safetensors"
    run = uuid.uuid4().hex[:12]
    keys = StreamKeys("bench", run)
    client = redis.Redis.from_url(redis_url, socket_timeout=400.0)  # above the longest BLPOP
    versions = RedisPolicyVersionStore(client, keys)
    served_key = f"{keys.base}:{SERVED_KEY}"
    log_path = tmp / name / "generator.log"

    def next_served(timeout_s: float = 300.0) -> bytes:
        reply = client.blpop([served_key], timeout=timeout_s)
        if reply is None:
            raise RuntimeError(f"generator process reported nothing in {timeout_s} s; log:\n{log_path.read_text()[-2000:]}")
        return reply[1]

    raw_write, raw_read, publish, detect, reload_hf, total = [], [], [], [], [], []
    with log_path.open("wb") as log:
        gen = subprocess.Popen(
            [sys.executable, "-m", "bench.weight_sync", "serve-generator", "--model-dir", str(model_dir),
             "--store", str(store.root), "--redis-url", redis_url, "--run", run],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    try:
        if next_served() != b"ready":
            raise RuntimeError("generator process: expected 'ready' first")
        for version in range(1, repeats + 1):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.0001)

            def raw() -> None:
                tensors = prepare_state_dict(model.state_dict(), shape["tie_word_embeddings"])
                t = time.perf_counter()
                save_file(tensors, str(raw_path))
                _fsync(raw_path)
                raw_write.append(time.perf_counter() - t)
                del tensors
                t = time.perf_counter()
                # load_file maps the file lazily; copying every tensor makes it a real read (as a reload does).
                loaded = {k: v.clone() for k, v in load_file(str(raw_path)).items()}
                raw_read.append(time.perf_counter() - t)
                del loaded
                raw_path.unlink()

            def ours(version: int = version) -> None:
                t0 = time.time()
                store.publish(model.state_dict(), version, model_dir)
                published = time.time()
                versions.set(version)
                announce_weights(client, keys, version)
                detected_at, served_at, served_version = next_served().split()
                if int(served_version) != version:
                    raise RuntimeError(f"generator served version {served_version.decode()}, expected {version}")
                # publish + detect + reload = total exactly; detect covers the version key, the
                # announcement and the generator's wake-up and read of LATEST.
                publish.append(published - t0)
                detect.append(float(detected_at) - published)
                reload_hf.append(float(served_at) - float(detected_at))
                total.append(float(served_at) - t0)
                store.prune(keep=1)

            # Alternate the order: the disk's write-back state favours whichever write comes second.
            if version % 2:
                raw()
                ours()
            else:
                ours()
                raw()
    finally:
        client.set(f"{keys.base}:stop", b"1")
        announce_weights(client, keys, 0)  # wake the watcher now so it sees the stop key
        try:
            gen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            gen.kill()
            gen.wait()
        client.close()
    weights_bytes = sum(f.stat().st_size for f in store.path_for(repeats).glob("*.safetensors"))
    raw_s = statistics.median(raw_write) + statistics.median(raw_read)
    ours_s = statistics.median(total)
    without = statistics.median(t - d for t, d in zip(total, detect, strict=True))
    row: dict[str, Any] = {
        "shape": name, "parameters": params, "weights_bytes": weights_bytes, "repeats": repeats,
        "raw_write_s": statistics.median(raw_write), "raw_read_s": statistics.median(raw_read),
        "publish_s": statistics.median(publish), "detect_s": statistics.median(detect),
        "detect_max_s": max(detect), "reload_hf_s": statistics.median(reload_hf),
        "weight_wait_s": WEIGHT_WAIT_S,
        "raw_s": raw_s, "ours_s": ours_s,
        "ratio_without_detection": without / raw_s, "ratio_over_raw": ours_s / raw_s,
        "samples": {"raw_write_s": raw_write, "raw_read_s": raw_read, "publish_s": publish, "detect_s": detect,
                    "reload_hf_s": reload_hf, "ours_s": total},
    }
    if vllm:
        from posttrain.inference.factory import vllm_available

        if not vllm_available():
            raise RuntimeError("--vllm: vllm does not import here")
        from posttrain.inference.vllm import VLLMEngine

        t = time.perf_counter()
        v_engine = VLLMEngine(model_dir, seed=0, max_model_len=512, dtype="float32")
        row["vllm_start_s"] = time.perf_counter() - t
        times = []
        try:
            for version in range(repeats + 1, 2 * repeats + 1):
                path = store.publish(model.state_dict(), version, model_dir)
                t = time.perf_counter()
                asyncio.run(v_engine.update_weights(path, version))
                times.append(time.perf_counter() - t)
        finally:
            v_engine.close()
        row["reload_vllm_s"] = statistics.median(times)
        row["ratio_over_raw_vllm"] = (row["publish_s"] + row["detect_s"] + row["reload_vllm_s"]) / raw_s
    return row


def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command and the table."""
    rows = []
    for r in result["rows"]:
        vllm = f" (vLLM reload {r['reload_vllm_s']:.3f} s, ratio {r['ratio_over_raw_vllm']:.2f})" if "reload_vllm_s" in r else ""
        rows.append([
            r["shape"], f"{r['parameters'] / 1e6:.1f} M", f"{r['weights_bytes'] / 2**20:.0f} MiB",
            f"{r['raw_write_s']:.3f} + {r['raw_read_s']:.3f}", f"{r['publish_s']:.3f}",
            f"{r['detect_s']:.3f} ({r['detect_max_s']:.3f})", f"{r['reload_hf_s']:.3f}{vllm}", f"{r['ours_s']:.3f}",
            f"{r['ratio_without_detection']:.2f}", f"**{r['ratio_over_raw']:.2f}**",
        ])
    return "\n".join([
        machine_line(result["machine"]),
        "",
        f"Command: `{result['command']}` (medians over versions: "
        + ", ".join(f"{r['shape']} {r['repeats']}" for r in result["rows"]) + "; seconds).",
        "",
        markdown_table(["shape", "parameters", "file", "raw write + read", "publish",
                        "detect (max)", "hf reload", "ours end to end", "ours/raw without detect", "ours/raw"], rows),
        "",
        f"Worst ratio over shapes, end to end (publish in the learner process until the generator process serves "
        f"the version; announcement over Redis pub/sub, fallback wait {result['weight_wait_s']} s): "
        f"**{result['worst_ratio_over_raw']:.2f}x** (target: at most 2x).",
    ])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (see the module docstring); ``serve-generator`` is the generator process."""
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list[:1] == ["serve-generator"]:
        g = argparse.ArgumentParser(description="generator side of bench.weight_sync (started by the benchmark)")
        g.add_argument("--model-dir", type=Path, required=True)
        g.add_argument("--store", type=Path, required=True)
        g.add_argument("--redis-url", required=True)
        g.add_argument("--run", required=True)
        ga = g.parse_args(args_list[1:])
        asyncio.run(_serve_versions(ga.model_dir, ga.store, ga.redis_url, ga.run))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--repeats", type=int, default=None,
                   help="versions per shape (default: 16 for tiny, whose sync takes milliseconds; 4 otherwise)")
    p.add_argument("--vllm", action="store_true", help="also time the vLLM engine's reload")
    p.add_argument("--tmp-dir", type=Path, default=None, help="where the weight files go (default: system temp)")
    p.add_argument("--redis-url", default=None, help="existing server; default: start an embedded one")
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args(args_list)
    from posttrain.generator.watcher import WEIGHT_WAIT_S
    from posttrain.services.embedded_redis import EmbeddedRedis

    embedded = None if args.redis_url else EmbeddedRedis().start()
    url = args.redis_url or embedded.url  # type: ignore[union-attr]
    rows = []
    try:
        with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
            for name in args.shapes:
                print(f"{name} ...", flush=True)
                repeats = args.repeats or (16 if name == "tiny" else 4)
                rows.append(measure_shape(name, SHAPES[name], repeats, args.vllm, Path(tmp), url))
    finally:
        if embedded is not None:
            embedded.stop()
    result = {
        "command": command_line("bench.weight_sync", argv),
        "machine": machine_info(),
        "notification": "redis pub/sub (posttrain.weight_sync.announce)",
        "weight_wait_s": WEIGHT_WAIT_S,
        "rows": rows,
        "worst_ratio_over_raw": max(r["ratio_over_raw"] for r in rows),
    }
    publish_result("weight_sync", result, render(result), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
