"""Weight-sync latency: a learner's publish until a generator serves the new version, against raw safetensors I/O.

Per model shape (random float32 weights: ``tiny`` and a Qwen2-0.5B shape) and version, alternately: **ours**, the
learner's publish (weight store, version key, ``announce_weights`` over Redis pub/sub) until ``update_weights`` of
the ``hf`` engine returns in a separate generator process watching as ``posttrain.generator.watcher`` does
(``--vllm`` also times vLLM's reload in-process); **raw**, ``save_file`` + fsync, then ``load_file`` with every
tensor copied. Reported (medians, seconds): publish, detection, reload, end to end and ours/raw.

Run: ``.venv/bin/python -m bench.weight_sync`` (about 3 minutes on 2 cores, mostly the 0.5B shape's 2 GB
writes), ``.venv/bin/python -m bench.weight_sync --shapes tiny --vllm`` (adds vLLM's reload).
"""

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from bench import common
from posttrain.rollout.keys import StreamKeys
from posttrain.services.embedded_redis import EmbeddedRedis

SERVED_KEY = "served"
"""Redis list (under the bench run's keys) where the generator process reports each version it serves."""
SHAPES: dict[str, tuple[dict[str, Any], int]] = {
    "tiny": ({"vocab_size": 1024, "hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
              "intermediate_size": 256, "tie_word_embeddings": False}, 16),
    "qwen2-0.5b": ({"vocab_size": 151936, "hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2,
                    "intermediate_size": 4864, "tie_word_embeddings": True}, 4),
}
"""Model shapes measured (``build_tiny_model`` arguments) and the versions published for each (medians over them)."""


async def _serve_versions(model_dir: str, store_dir: str, redis_url: str, run: str) -> None:
    """The generator side, ``posttrain.generator.watcher``'s loop around an ``hf`` engine: reload when ``LATEST``'s stamp
    changed (then push ``detected_at served_at version`` to ``SERVED_KEY``), stop on the stop key, else wait."""
    from posttrain.generator.watcher import WEIGHT_WAIT_S
    from posttrain.inference.hf import HFEngine
    from posttrain.weight_sync.announce import WeightAnnouncements
    from posttrain.weight_sync.store import FilesystemWeightStore

    keys, client = StreamKeys("bench", run), redis.Redis.from_url(redis_url)
    store, engine = FilesystemWeightStore(store_dir), HFEngine(model_dir)
    announcements = WeightAnnouncements(redis_url, keys)
    await announcements.subscribe()
    served = (-1, 0)  # (version, mtime of its directory): the store starts empty
    client.rpush(f"{keys.base}:{SERVED_KEY}", b"ready")
    try:
        while True:
            latest, detected_at = store.latest_version(), time.time()
            if latest is not None:
                try:
                    current = (latest, store.path_for(latest).stat().st_mtime_ns)
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
    """Medians (seconds) of raw write and read and of publish, detection and reload for one shape; RuntimeError (with
    its log's tail) when the generator process reports nothing for 300 s, ImportError for ``vllm`` without vLLM."""
    import torch
    from safetensors.torch import load_file, save_file

    from posttrain.generator.watcher import WEIGHT_WAIT_S
    from posttrain.models.hf import build_tiny_model, load_policy
    from posttrain.rollout.redis_streams import RedisPolicyVersionStore
    from posttrain.weight_sync.announce import announce_weights
    from posttrain.weight_sync.store import FilesystemWeightStore, prepare_state_dict

    model_dir = build_tiny_model(tmp / name / "model", **shape)
    model = load_policy(model_dir)
    store, raw_path, log_path = FilesystemWeightStore(tmp / name / "store"), tmp / name / "raw.safetensors", tmp / name / "gen.log"
    run = uuid.uuid4().hex[:12]
    keys, client = StreamKeys("bench", run), redis.Redis.from_url(redis_url, socket_timeout=400.0)  # above any BLPOP
    versions, served_key = RedisPolicyVersionStore(client, keys), f"{keys.base}:{SERVED_KEY}"

    def next_served(timeout_s: float = 300.0) -> bytes:
        reply = client.blpop([served_key], timeout=timeout_s)
        if reply is None:
            raise RuntimeError(f"generator process reported nothing in {timeout_s} s; log:\n{log_path.read_text()[-2000:]}")
        return reply[1]

    s: dict[str, list[float]] = {k: [] for k in ("raw_write_s", "raw_read_s", "publish_s", "detect_s", "reload_hf_s", "ours_s")}

    def raw(_: int) -> None:
        tensors = prepare_state_dict(model.state_dict(), shape["tie_word_embeddings"])
        t = time.perf_counter()
        save_file(tensors, str(raw_path))
        with open(raw_path, "rb") as fh:
            os.fsync(fh.fileno())
        s["raw_write_s"].append(time.perf_counter() - t)
        # load_file only maps the file: copying each tensor reads it
        s["raw_read_s"].append(common.seconds(lambda: {k: v.clone() for k, v in load_file(str(raw_path)).items()}))
        raw_path.unlink()

    def ours(version: int) -> None:
        t0 = time.time()
        store.publish(model.state_dict(), version, model_dir)
        published = time.time()
        versions.set(version)
        announce_weights(client, keys, version)
        detected_at, served_at, served_version = next_served().split()
        if int(served_version) != version:
            raise RuntimeError(f"generator served version {served_version.decode()}, expected {version}")
        # publish + detect + reload = end to end; detect: version key, announcement, wake-up, read of LATEST
        s["publish_s"].append(published - t0)
        s["detect_s"].append(float(detected_at) - published)
        s["reload_hf_s"].append(float(served_at) - float(detected_at))
        s["ours_s"].append(float(served_at) - t0)
        store.prune(keep=1)

    with log_path.open("wb") as log:
        gen = subprocess.Popen([sys.executable, "-m", "bench.weight_sync", "serve-generator", str(model_dir), str(store.root),
                                redis_url, run], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        next_served()  # "ready": the generator process serves the model it was built with
        for version in range(1, repeats + 1):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.0001)
            for step in ((raw, ours) if version % 2 else (ours, raw)):  # the disk's write-back favours the second
                step(version)
    finally:
        client.set(f"{keys.base}:stop", b"1")
        announce_weights(client, keys, 0)  # wake the watcher now so it sees the stop key
        try:
            gen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            gen.kill()
            gen.wait()
        client.close()
    med = {k: statistics.median(v) for k, v in s.items()}
    raw_s = med["raw_write_s"] + med["raw_read_s"]
    row: dict[str, Any] = {
        "shape": name, "parameters": sum(p.numel() for p in model.parameters()), "repeats": repeats,
        "weights_bytes": sum(f.stat().st_size for f in store.path_for(repeats).glob("*.safetensors")),
        **{k: v for k, v in med.items() if k != "ours_s"}, "detect_max_s": max(s["detect_s"]),
        "weight_wait_s": WEIGHT_WAIT_S, "raw_s": raw_s, "ours_s": med["ours_s"],
        "ratio_without_detection": statistics.median(t - d for t, d in zip(s["ours_s"], s["detect_s"], strict=True)) / raw_s,
        "ratio_over_raw": med["ours_s"] / raw_s, "samples": s}
    if vllm:
        from posttrain.inference.vllm import VLLMEngine

        t = time.perf_counter()
        v_engine = VLLMEngine(model_dir, seed=0, max_model_len=512, dtype="float32")
        row["vllm_start_s"], times = time.perf_counter() - t, []
        try:
            for version in range(repeats + 1, 2 * repeats + 1):
                path = store.publish(model.state_dict(), version, model_dir)
                times.append(common.seconds(asyncio.run, v_engine.update_weights(path, version)))
        finally:
            v_engine.close()
        row["reload_vllm_s"] = statistics.median(times)
        row["ratio_over_raw_vllm"] = (row["publish_s"] + row["detect_s"] + row["reload_vllm_s"]) / raw_s
    return row


def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command and the table."""
    vllm = " (vLLM reload {reload_vllm_s:.3f} s, ratio {ratio_over_raw_vllm:.2f})"
    rows = [[r["shape"], f"{r['parameters'] / 1e6:.1f} M", f"{r['raw_write_s']:.3f} + {r['raw_read_s']:.3f}",
             f"{r['publish_s']:.3f}", f"{r['detect_s']:.3f} ({r['detect_max_s']:.3f})",
             f"{r['reload_hf_s']:.3f}" + (vllm.format(**r) if "reload_vllm_s" in r else ""),
             f"**{r['ratio_over_raw']:.2f}**"] for r in result["rows"]]
    return "\n".join([
        common.machine_line(result["machine"]), "",
        f"Command: `{result['command']}` (medians over versions: "
        + ", ".join(f"{r['shape']} {r['repeats']}" for r in result["rows"]) + "; seconds).", "",
        common.markdown_table(["shape", "parameters", "raw write + read", "publish", "detect (max)", "hf reload",
                               "ours/raw"], rows), "",
        "File size, ours end to end and the ratio without detection: the results file.", "",
        f"Worst ratio over shapes, end to end (publish in the learner process until the generator process serves "
        f"the version; announcement over Redis pub/sub, fallback wait {result['weight_wait_s']} s): "
        f"**{result['worst_ratio_over_raw']:.2f}x** (target: at most 2x).",
    ])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring); ``serve-generator MODEL_DIR STORE REDIS_URL RUN`` is the generator process."""
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list[:1] == ["serve-generator"]:
        asyncio.run(_serve_versions(*args_list[1:]))
        return 0
    p = common.parser(__doc__, common.RESULTS_DIR / "weight_sync.json")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--vllm", action="store_true", help="also time the vLLM engine's reload")
    args = p.parse_args(args_list)
    with EmbeddedRedis() as server, tempfile.TemporaryDirectory() as tmp:
        rows = [measure_shape(name, *SHAPES[name], args.vllm, Path(tmp), server.url) for name in args.shapes]
    result = {"command": common.command_line("bench.weight_sync", argv), "machine": common.machine_info(),
              "notification": "redis pub/sub (posttrain.weight_sync.announce)", "weight_wait_s": rows[0]["weight_wait_s"],
              "rows": rows, "worst_ratio_over_raw": max(r["ratio_over_raw"] for r in rows)}
    common.publish_result(args.out, result, "weight_sync", lambda: render(result), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    common.run_main("bench.weight_sync", main)
