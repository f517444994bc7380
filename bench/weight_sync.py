"""Benchmark: publish weights to the filesystem weight store and reload them into the engines.

Measures, for a randomly initialised model of the given shape: seconds to publish one version
(``FilesystemWeightStore.publish``: copy, safetensors write, fsync, rename) and seconds for
``update_weights`` in the ``hf`` engine and, with ``--vllm``, in the ``vllm`` engine (pause, wait
for in-flight requests, in-place reload, prefix-cache reset, resume). Prints one JSON object;
``--out FILE`` also appends it to a JSON list in FILE.

Run: ``python bench/weight_sync.py --vllm`` (tiny model, about a minute on 2 CPU cores, most of it
vLLM start-up) or ``python bench/weight_sync.py --hidden 896 --layers 24 --heads 14 --kv-heads 2
--vocab 151936 --intermediate 4864`` (Qwen2-0.5B shape).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--intermediate", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vllm", action="store_true", help="also time the vLLM engine's reload")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from posttrain.generator.engines.hf import HFEngine
    from posttrain.learner.model import build_tiny_model, load_policy
    from posttrain.weight_sync import FilesystemWeightStore

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(
            Path(tmp) / "model",
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.heads,
            num_kv_heads=args.kv_heads,
            intermediate_size=args.intermediate,
        )
        model = load_policy(model_dir)
        params = sum(p.numel() for p in model.parameters())
        store = FilesystemWeightStore(Path(tmp) / "store")
        publish_s = []
        for version in range(args.repeats):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.0001)
            start = time.perf_counter()
            store.publish(model.state_dict(), version, model_dir)
            publish_s.append(time.perf_counter() - start)

        def time_reloads(engine) -> list[float]:
            async def go() -> list[float]:
                out = []
                for version in range(args.repeats):
                    start = time.perf_counter()
                    await engine.update_weights(store.path_for(version), version)
                    out.append(time.perf_counter() - start)
                return out

            return asyncio.run(go())

        hf = HFEngine(model_dir)
        result = {
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "parameters": params,
            "weights_bytes": (store.path_for(0) / "model.safetensors").stat().st_size,
            "publish_s_median": round(statistics.median(publish_s), 4),
            "hf_update_s_median": round(statistics.median(time_reloads(hf)), 4),
        }
        hf.close()
        if args.vllm:
            from posttrain.generator.engines.vllm import VLLMEngine

            start = time.perf_counter()
            engine = VLLMEngine(model_dir, seed=0, max_model_len=512, dtype="float32")
            result["vllm_start_s"] = round(time.perf_counter() - start, 1)
            result["vllm_update_s_median"] = round(statistics.median(time_reloads(engine)), 4)
            engine.close()
    print(json.dumps(result, indent=2))
    if args.out is not None:
        rows = json.loads(args.out.read_text()) if args.out.exists() else []
        rows.append(result)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
