"""Weight-sync latency: a learner's publish until a generator serves the new version, against raw safetensors I/O.

For each model shape (random weights; ``tiny`` and a Qwen2-0.5B-shaped model: vocabulary
151,936, hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4,864, tied embeddings, float32 as the
CPU learner publishes it) and ``--repeats`` versions:

* **ours** = ``FilesystemWeightStore.publish`` (copy the tensors, safetensors write, fsync,
  rename, ``LATEST``) + the generator's detection delay + ``update_weights`` of the ``hf`` engine
  (``load_file`` and ``load_state_dict`` in place; with ``--vllm`` also the vLLM engine). The
  generator's watcher (``posttrain.generator.worker``) polls ``LATEST`` every
  ``POLL_INTERVAL_S`` = 0.2 s, so detection adds 0.1 s on average (counted) and 0.2 s at worst;
* **raw** = ``safetensors.torch.save_file`` of the same tensors + fsync, then ``load_file`` with
  every tensor copied into memory (``load_file`` alone only maps the file), nothing else.

The two run alternately (raw first on odd versions, ours first on even ones).

The table reports medians in seconds and ``ratio = ours / raw`` with and without the detection
delay; ``worst_ratio_over_raw`` (over shapes, with detection) is the number the target (at most
2x) is checked against. Writes ``bench/results/weight_sync.json`` and the ``weight_sync`` section
of docs/benchmarks.md.

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
    refresh_targets,
    update_docs_section,
    write_result,
)

POLL_INTERVAL_S = 0.2
"""How often a generator's watcher reads ``LATEST`` (``posttrain.generator.worker``: ``asyncio.sleep(0.2)``)."""

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


def measure_shape(name: str, shape: dict[str, Any], repeats: int, vllm: bool, tmp: Path) -> dict[str, Any]:
    """Medians (seconds) of raw write/read and of publish, detection and reload for one shape.

    Raises:
        RuntimeError: ``vllm`` is set but vLLM does not import.
    """
    import torch
    from safetensors.torch import load_file, save_file

    from posttrain.generator.engines.hf import HFEngine
    from posttrain.learner.model import build_tiny_model, load_policy
    from posttrain.weight_sync.store import FilesystemWeightStore, prepare_state_dict

    model_dir = build_tiny_model(tmp / name / "model", **shape)
    model = load_policy(model_dir)
    params = sum(p.numel() for p in model.parameters())
    store = FilesystemWeightStore(tmp / name / "store")
    raw_path = tmp / name / "raw.safetensors"
    raw_write, raw_read, publish, reload_hf = [], [], [], []
    engine = HFEngine(model_dir)
    try:
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
                t = time.perf_counter()
                path = store.publish(model.state_dict(), version, model_dir)
                publish.append(time.perf_counter() - t)
                t = time.perf_counter()
                asyncio.run(engine.update_weights(path, version))
                reload_hf.append(time.perf_counter() - t)
                store.prune(keep=1)

            # Alternate the order: the disk's write-back state favours whichever write comes second.
            if version % 2:
                raw()
                ours()
            else:
                ours()
                raw()
    finally:
        engine.close()
    weights_bytes = sum(f.stat().st_size for f in store.path_for(repeats).glob("*.safetensors"))
    raw = statistics.median(raw_write) + statistics.median(raw_read)
    ours = statistics.median(publish) + statistics.median(reload_hf)
    row: dict[str, Any] = {
        "shape": name, "parameters": params, "weights_bytes": weights_bytes, "repeats": repeats,
        "raw_write_s": statistics.median(raw_write), "raw_read_s": statistics.median(raw_read),
        "publish_s": statistics.median(publish), "reload_hf_s": statistics.median(reload_hf),
        "detect_mean_s": POLL_INTERVAL_S / 2, "detect_max_s": POLL_INTERVAL_S,
        "raw_s": raw, "ours_s": ours + POLL_INTERVAL_S / 2,
        "ratio_without_detection": ours / raw, "ratio_over_raw": (ours + POLL_INTERVAL_S / 2) / raw,
        "samples": {"raw_write_s": raw_write, "raw_read_s": raw_read, "publish_s": publish, "reload_hf_s": reload_hf},
    }
    if vllm:
        from posttrain.generator.engines.factory import vllm_available

        if not vllm_available():
            raise RuntimeError("--vllm: vllm does not import here")
        from posttrain.generator.engines.vllm import VLLMEngine

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
        row["ratio_over_raw_vllm"] = (row["publish_s"] + row["reload_vllm_s"] + POLL_INTERVAL_S / 2) / raw
    return row


def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command and the table."""
    rows = []
    for r in result["rows"]:
        vllm = f" (vLLM reload {r['reload_vllm_s']:.3f} s, ratio {r['ratio_over_raw_vllm']:.2f})" if "reload_vllm_s" in r else ""
        rows.append([
            r["shape"], f"{r['parameters'] / 1e6:.1f} M", f"{r['weights_bytes'] / 2**20:.0f} MiB",
            f"{r['raw_write_s']:.3f} + {r['raw_read_s']:.3f}", f"{r['publish_s']:.3f}", f"{r['detect_mean_s']:.3f}",
            f"{r['reload_hf_s']:.3f}{vllm}", f"{r['ratio_without_detection']:.2f}", f"**{r['ratio_over_raw']:.2f}**",
        ])
    return "\n".join([
        machine_line(result["machine"]),
        "",
        f"Command: `{result['command']}` (medians of {result['rows'][0]['repeats']} versions; seconds).",
        "",
        markdown_table(["shape", "parameters", "file", "raw write + read", "publish", "detect (mean)",
                        "hf reload", "ours/raw without detect", "ours/raw"], rows),
        "",
        f"Worst ratio over shapes (with the mean detection delay of the {POLL_INTERVAL_S} s poll): "
        f"**{result['worst_ratio_over_raw']:.2f}x** (target: at most 2x).",
    ])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--vllm", action="store_true", help="also time the vLLM engine's reload")
    p.add_argument("--tmp-dir", type=Path, default=None, help="where the weight files go (default: system temp)")
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
        for name in args.shapes:
            print(f"{name} ...", flush=True)
            rows.append(measure_shape(name, SHAPES[name], args.repeats, args.vllm, Path(tmp)))
    result = {
        "command": command_line("bench.weight_sync", argv),
        "machine": machine_info(),
        "poll_interval_s": POLL_INTERVAL_S,
        "rows": rows,
        "worst_ratio_over_raw": max(r["ratio_over_raw"] for r in rows),
    }
    path = write_result("weight_sync", result)
    if not args.no_docs:
        update_docs_section("weight_sync", render(result))
        refresh_targets()
    print(render(result))
    print(f"\nWrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
