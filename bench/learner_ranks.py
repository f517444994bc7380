"""Learner step time on 1 and 2 ranks (FSDP2 over gloo, CPU), and memory per rank with and without sharding.

(a) **Step time.** For each model shape (``tiny``, and ``mid`` ~16 M parameters), one global batch of 8 rollouts
(``batch_specs``: 24-48 prompt tokens, 24-64 action tokens), micro-batches of 2 rows per rank: the SFT step (the
rows' NLL, AdamW) and the SAO step (``sao_train_step``: critic values, 2 critic updates, the DIS policy update),
timed from a barrier before to a barrier after, median over ``--rounds`` runs of ``--steps`` steps after
``--warmup``. Three layouts: 1 rank x 1 thread, 1 rank x 2 threads and 2 ranks x 1 thread (``torchrun
--standalone``, FSDP2 per transformer block); 2 ranks x 1 thread against 1 rank x 2 threads is the comparison at
equal resources (two threads in all).

(b) **Memory.** A Qwen2-0.5B-shaped model (``QWEN2_05B``) built in memory with random weights, one SFT step on
2 rows x 64 tokens, one thread per rank, on 1 rank (unsharded) and then on 2 ranks (sharded; never both at
once): per rank the bytes of parameters, gradients and AdamW state it holds (local shards: ``DTensor.to_local``),
and its peak RSS (``getrusage``) while building and sharding the model, then during the step (the peak is reset
in between through ``/proc/self/clear_refs``).

Run: ``.venv/bin/python -m bench.learner_ranks`` (about 20 minutes on 2 shared cores; the memory part holds up
to ~10 GiB of RAM), ``... --shapes tiny --rounds 1 --skip-memory`` (two minutes). The workers, as one process or
under torchrun: ``python -m bench.learner_ranks worker steps MODEL_DIR OUT`` and ``... worker memory SHAPE OUT``.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench import common

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"vocab_size": 1024, "hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
             "intermediate_size": 256},
    "mid": {"vocab_size": 8192, "hidden_size": 384, "num_layers": 6, "num_heads": 6, "num_kv_heads": 2,
            "intermediate_size": 1024},
}
"""Shapes of the step-time part (``build_tiny_model`` arguments; untied embeddings)."""
QWEN2_05B: dict[str, Any] = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                             "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                             "tie_word_embeddings": True}
"""``transformers.Qwen2Config`` of the memory part (Qwen2-0.5B's shape)."""
MEMORY_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": QWEN2_05B,
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
             "intermediate_size": 256, "vocab_size": 1024, "tie_word_embeddings": True},
}
"""Memory-part shapes; ``tiny`` is what the unit test runs."""
LAYOUTS: list[tuple[int, int]] = [(1, 1), (1, 2), (2, 1)]
"""(ranks, torch threads per rank) of the step-time part."""
MICRO_BATCH_SIZE = 2
"""Rows per forward pass on each rank."""
BATCH_ROWS = 8
"""Rollouts (SAO) or rows (SFT) per optimizer step: the global batch."""
OMP_WAIT_POLICY = "PASSIVE"
"""OpenMP threads sleep while they wait. With the default (spin, then sleep) 1 rank x 2 threads took 0.8-17 s per
tiny step instead of 0.3-1.6 s on the shared 2-core machine: a spinning thread holds a core another thread needs."""


# --- pure helpers -----------------------------------------------------------------------------------------------


def local_nbytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor`` held by this rank: the local shard of a ``DTensor``, else the whole tensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return tensor.numel() * tensor.element_size()


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds for ``model``'s parameters, their gradients (where set) and ``optimizer``'s state.

    Tied parameters count once (``model.parameters()`` yields a shared tensor once). AdamW's state is
    ``exp_avg`` and ``exp_avg_sq`` (sharded like the parameter) plus a scalar ``step`` per parameter.
    """
    params = list(model.parameters())
    state = optimizer.state.values() if optimizer is not None else []
    return {
        "parameters": sum(local_nbytes(p) for p in params),
        "gradients": sum(local_nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(local_nbytes(v) for s in state for v in s.values() if isinstance(v, torch.Tensor)),
    }


def peak_rss_bytes() -> int:
    """This process's peak resident set (``getrusage`` ``ru_maxrss``, KiB on Linux), in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Reset the peak resident set to the current one (Linux ``/proc/self/clear_refs``); False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def median_after_warmup(times: Sequence[float], warmup: int) -> float:
    """Median of ``times`` without the first ``warmup``; ValueError when nothing is left."""
    kept = list(times[warmup:])
    if not kept:
        raise ValueError(f"times: {len(times)} steps, none left after a warm-up of {warmup}")
    return statistics.median(kept)


def per_rank(world: Any, values: Sequence[float]) -> list[list[float]]:
    """``values`` of every rank, rank order (one ``world.sum`` over a vector where each rank fills its own row)."""
    k = len(values)
    flat = [0.0] * (k * world.size)
    flat[world.rank * k : (world.rank + 1) * k] = [float(v) for v in values]
    total = world.sum(flat)
    return [total[r * k : (r + 1) * k] for r in range(world.size)]


def batch_specs(seed: int = 0) -> list[tuple[int, int, float]]:
    """The global batch: ``BATCH_ROWS`` (prompt tokens, action tokens, reward), 24-48 prompt and 24-64 action tokens."""
    rng = random.Random(seed)
    return [(rng.randint(24, 48), rng.randint(24, 64), float(i % 2)) for i in range(BATCH_ROWS)]


# --- the workers (one rank each) --------------------------------------------------------------------------------


def make_rollouts(policy: nn.Module, specs: Sequence[tuple[int, int, float]], device: str = "cpu") -> list[Any]:
    """Rollouts of random tokens, one per ``(prompt tokens, action tokens, reward)`` of ``specs`` (seed 0).

    The behaviour logprobs are ``policy``'s own (computed on ``device``), shifted by up to +-0.1 nats, so most
    ratios fall inside the SAO DIS band and the policy update is a real one.
    """
    from posttrain.losses.logprobs import token_logprobs
    from posttrain.records import Rollout

    policy = policy.eval().to(device)
    vocab = int(policy.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (n_prompt, n_action, reward) in enumerate(specs):
        ids = torch.randint(3, vocab, (n_prompt + n_action,), generator=g).tolist()
        t = torch.tensor([ids], device=device)
        with torch.no_grad():
            own = token_logprobs(policy(input_ids=t).logits, t)[0, n_prompt:].cpu()
        lp = (own + 0.2 * (torch.rand(n_action, generator=g) - 0.5)).tolist()
        out.append(Rollout(rollout_id=f"r{i}", task_id=f"t{i}", env_name="synthetic_arith", token_ids=ids,
                           behaviour_logprobs=[0.0] * n_prompt + lp, action_mask=[False] * n_prompt + [True] * n_action,
                           reward=reward, policy_version=0))
    return out


def sft_rank_step(model: nn.Module, rows: Sequence[Any], world: Any, *, pad_token_id: int,
                  micro_batch_size: int) -> float:
    """Forward/backward of one SFT step's ``rows`` on this rank's share (``learner.packing.sft_step``);
    returns the step's mean NLL per trained token over all ranks."""
    from posttrain.learner.packing import sft_step

    return sft_step(model, rows, pad_token_id=pad_token_id, micro_batch_size=micro_batch_size, world=world).loss


def _timed(world: Any, fn: Any, n: int) -> list[float]:
    """Seconds of ``n`` calls ``fn(i)``, each from a barrier before to a barrier after (the slowest rank's time)."""
    times = []
    for i in range(n):
        world.barrier()
        t = time.perf_counter()
        fn(i)
        world.barrier()
        times.append(time.perf_counter() - t)
    return times


def _time_sft(model_dir: Path, rollouts: Sequence[Any], world: Any, n: int) -> dict[str, Any]:
    """``n`` timed SFT steps on the rollouts' tokens (trained on their action tokens, one row each)."""
    from posttrain.config import LearnerConfig, OptimConfig
    from posttrain.learner.optim import build_optimizer, clip_and_step
    from posttrain.learner.packing import pack_examples
    from posttrain.learner.sft import TokenExample
    from posttrain.models.hf import load_policy
    from posttrain.parallel.placement import prepare_model

    model = prepare_model(load_policy(model_dir), world, LearnerConfig(device="cpu"))
    rows = pack_examples([TokenExample(list(r.token_ids), list(r.action_mask)) for r in rollouts], 256, packing=False)
    optimizer, scheduler = build_optimizer(model, OptimConfig(lr=1e-5), n)
    model.train()
    losses: list[float] = []

    def sft(_: int) -> None:
        losses.append(sft_rank_step(model, rows, world, pad_token_id=0, micro_batch_size=MICRO_BATCH_SIZE))
        clip_and_step(model, optimizer, scheduler, 1.0)

    return {"step_s": _timed(world, sft, n), "loss_first": losses[0]}


def _time_sao(model_dir: Path, rollouts: Sequence[Any], world: Any, n: int) -> dict[str, Any]:
    """``n`` timed SAO steps (policy and critic; 2 critic updates, then the DIS policy update, every step)."""
    from posttrain.config import LearnerConfig, SAOConfig
    from posttrain.learner.batching import collate_rollouts
    from posttrain.learner.critic import CriticModel
    from posttrain.learner.optim import build_optimizer
    from posttrain.learner.sao_step import sao_train_step
    from posttrain.learner.types import Trainable
    from posttrain.models.hf import load_policy
    from posttrain.parallel.placement import prepare_model

    learner = LearnerConfig(device="cpu")
    config = SAOConfig(batch_size=len(rollouts), micro_batch_size=MICRO_BATCH_SIZE, optim={"lr": 1e-5},
                       critic={"warmup_steps": 0, "updates_per_step": 2, "lr": 1e-5})
    policy_model = prepare_model(load_policy(model_dir), world, learner)
    critic_model = prepare_model(CriticModel.from_policy_path(model_dir), world, learner)
    policy = Trainable(policy_model, *build_optimizer(policy_model, config.optim, n))
    critic = Trainable(critic_model, *build_optimizer(critic_model, config.optim.model_copy(update={"lr": 1e-5}), n))
    batch = collate_rollouts(rollouts, 0)
    first: dict[str, float] = {}

    def sao(i: int) -> None:
        metrics = sao_train_step(policy=policy, critic=critic, batch=batch, config=config, iteration=i, world=world).metrics
        first.update({} if first else {k: metrics[k] for k in ("loss/policy", "loss/value")})

    return {"step_s": _timed(world, sao, n), "loss_first": first}


def steps_worker(model_dir: Path, out: Path, steps: int, warmup: int) -> None:
    """Time ``warmup + steps`` SFT steps, then as many SAO steps, on the model in ``model_dir``; rank 0 writes ``out``."""
    from posttrain.config import LearnerConfig
    from posttrain.models.hf import load_policy
    from posttrain.parallel.world import init_world, shutdown_world

    torch.manual_seed(0)
    world = init_world(LearnerConfig(device="cpu"))
    n = warmup + steps
    start = load_policy(model_dir).eval()
    rollouts = make_rollouts(start, batch_specs())
    result: dict[str, Any] = {"ranks": world.size, "threads": torch.get_num_threads(), "batch_rows": len(rollouts),
                              "parameters": sum(p.numel() for p in start.parameters()),
                              "batch_tokens": sum(len(r.token_ids) for r in rollouts), "micro_batch_size": MICRO_BATCH_SIZE}
    del start
    result["sft"] = _time_sft(model_dir, rollouts, world, n)
    result["sao"] = _time_sao(model_dir, rollouts, world, n)
    result["peak_rss_bytes_per_rank"] = [row[0] for row in per_rank(world, [peak_rss_bytes()])]
    if world.is_main:
        common.write_result(out, result)
    shutdown_world()


def _build_in_memory(shape: dict[str, Any]) -> nn.Module:
    """A ``Qwen2ForCausalLM`` of ``shape`` (``Qwen2Config`` fields) with random weights (seed 0), never saved."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**shape, torch_dtype="float32"))


def memory_worker(shape_name: str, out: Path, rows: int = 2, tokens: int = 64) -> None:
    """One SFT step of ``rows`` x ``tokens`` on the in-memory model ``MEMORY_SHAPES[shape_name]``; per rank, the
    bytes of model state held and the peak RSS while building and sharding, and during the step; rank 0 writes ``out``."""
    from posttrain.config import LearnerConfig, OptimConfig
    from posttrain.learner.optim import build_optimizer, clip_and_step
    from posttrain.learner.packing import pack_examples
    from posttrain.learner.sft import TokenExample
    from posttrain.parallel.placement import prepare_model
    from posttrain.parallel.world import init_world, shutdown_world

    learner = LearnerConfig(device="cpu")
    world = init_world(learner)
    shape = MEMORY_SHAPES[shape_name]
    t0 = time.perf_counter()
    model = prepare_model(_build_in_memory(shape), world, learner)
    optimizer, scheduler = build_optimizer(model, OptimConfig(lr=1e-5), 1)
    setup_s, setup_peak = time.perf_counter() - t0, peak_rss_bytes()
    reset = reset_peak_rss()
    g = torch.Generator().manual_seed(1)
    examples = [TokenExample(torch.randint(3, shape["vocab_size"], (tokens,), generator=g).tolist(), [True] * tokens)
                for _ in range(rows)]
    model.train()
    t0 = time.perf_counter()
    loss = sft_rank_step(model, pack_examples(examples, tokens, packing=False), world, pad_token_id=0,
                         micro_batch_size=1)
    held = model_state_bytes(model)  # gradients are set between backward and the optimizer step
    grad_norm = clip_and_step(model, optimizer, scheduler, 1.0)
    held["optimizer"] = model_state_bytes(model, optimizer)["optimizer"]
    step_s, step_peak = time.perf_counter() - t0, peak_rss_bytes()
    keys = ("parameters", "gradients", "optimizer")
    table = per_rank(world, [*(held[k] for k in keys), setup_peak, step_peak, setup_s, step_s])
    result = {"shape": shape_name, "config": shape, "ranks": world.size, "threads": torch.get_num_threads(),
              "sharded": world.distributed, "rows": rows, "tokens_per_row": tokens, "loss": loss, "grad_norm": grad_norm,
              "parameter_count": sum(p.numel() for p in model.parameters()), "peak_reset": reset,
              "per_rank": [{**{k: int(r[i]) for i, k in enumerate(keys)}, "state_bytes": int(sum(r[:3])),
                            "peak_rss_setup_bytes": int(r[3]), "peak_rss_step_bytes": int(r[4]),
                            "setup_s": r[5], "step_s": r[6]} for r in table]}
    if world.is_main:
        common.write_result(out, result)
    shutdown_world()


# --- the driver ------------------------------------------------------------------------------------------------


def launch(worker_args: Sequence[str], ranks: int, threads: int, timeout_s: float = 1800) -> None:
    """Run ``worker ...`` as one process or under ``torchrun --standalone`` with ``threads`` torch threads per rank;
    RuntimeError with the tail of its output when it fails."""
    src = str(common.REPO / "src")
    path = os.pathsep.join(p for p in (src, str(common.REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": OMP_WAIT_POLICY}
    module = ["-m", "bench.learner_ranks", "worker", *worker_args]
    cmd = ([sys.executable, *module] if ranks == 1 else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), *module])
    done = subprocess.run(cmd, env=env, cwd=common.REPO, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")


def step_rows(shape: str, runs: dict[str, list[dict[str, Any]]], warmup: int) -> list[dict[str, Any]]:
    """One row per technique and layout from its runs (one per round): the median seconds/step over every measured
    step of every round, the medians of each round, tokens/s, and the ratios to the 1-rank layouts."""
    out = []
    for technique in ("sft", "sao"):
        medians = {k: statistics.median([t for r in rs for t in r[technique]["step_s"][warmup:]]) for k, rs in runs.items()}
        for key, rs in runs.items():
            r = rs[0]
            out.append({"shape": shape, "technique": technique, "layout": key, "ranks": r["ranks"], "threads": r["threads"],
                        "parameters": r["parameters"], "step_s": medians[key],
                        "round_medians_s": [median_after_warmup(x[technique]["step_s"], warmup) for x in rs],
                        "step_s_all": [x[technique]["step_s"] for x in rs],
                        "tokens_per_s": r["batch_tokens"] / medians[key],
                        "loss_first": r[technique]["loss_first"],
                        "peak_rss_bytes_per_rank": [max(v) for v in zip(*(x["peak_rss_bytes_per_rank"] for x in rs), strict=True)],
                        "ratio_over_1x1": medians[key] / medians["1x1"] if "1x1" in medians else None,
                        "ratio_over_1x2": medians[key] / medians["1x2"] if "1x2" in medians else None})
    return out


def measure_steps(shapes: Sequence[str], steps: int, warmup: int, rounds: int, tmp: Path) -> list[dict[str, Any]]:
    """Build each shape's model on disk, then run every layout of ``LAYOUTS`` once per round, one after the other,
    in ``LAYOUTS`` order in even rounds and reversed in odd ones (the machine's load drifts)."""
    from posttrain.models.hf import build_tiny_model

    rows = []
    for shape in shapes:
        model_dir = build_tiny_model(tmp / shape, seed=0, **SHAPES[shape])
        runs: dict[str, list[dict[str, Any]]] = {f"{r}x{t}": [] for r, t in LAYOUTS}
        for round_ in range(rounds):
            for ranks, threads in LAYOUTS if round_ % 2 == 0 else LAYOUTS[::-1]:
                key, out = f"{ranks}x{threads}", tmp / f"{shape}-{ranks}x{threads}.json"
                print(f"steps: {shape}, round {round_ + 1}/{rounds}, {ranks} rank(s) x {threads} thread(s)", flush=True)
                launch(["steps", str(model_dir), str(out), "--steps", str(steps), "--warmup", str(warmup)], ranks, threads)
                runs[key].append(common.read_json(out))
        rows.extend(step_rows(shape, runs, warmup))
    return rows


def measure_memory(shape: str, tmp: Path) -> list[dict[str, Any]]:
    """The memory worker on 1 rank (unsharded), then on 2 ranks (sharded); one thread per rank."""
    results = []
    for ranks, threads in ((1, 1), (2, 1)):
        out = tmp / f"memory-{shape}-{ranks}.json"
        print(f"memory: {shape}, {ranks} rank(s)", flush=True)
        launch(["memory", shape, str(out)], ranks, threads)
        results.append(common.read_json(out))
    return results


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def _ratio(value: float | None, bold: bool = False) -> str:
    if value is None:
        return "-"
    return f"**{value:.2f}**" if bold else f"{value:.2f}"


def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command, the step-time table and the memory table."""
    lines = [common.machine_line(result["machine"]), "",
             f"Command: `{result['command']}` (FSDP2 over gloo, `torchrun --standalone`; on 2 shared cores this "
             "measures the code path's overhead, not a speed-up).", ""]
    steps = result.get("steps") or []
    if steps:
        lines += [f"**Step time.** Global batch of {result['batch_rows']} rollouts ({result['batch_tokens']} tokens), "
                  f"micro-batches of {result['micro_batch_size']} rows per rank; seconds per optimizer step, median of "
                  f"{result['rounds']} run(s) x {result['steps_measured']} steps after {result['warmup']} warm-up (each "
                  "run's median in brackets). SAO: critic values, 2 critic updates, the DIS policy update. **2 x 1 "
                  "against 1 x 2 is the comparison at equal resources** (two threads in all). `OMP_WAIT_POLICY="
                  f"{result.get('omp_wait_policy', 'unset')}`.", ""]
        table = [[r["shape"], f"{r['parameters'] / 1e6:.1f} M", r["technique"].upper(), f"{r['ranks']} x {r['threads']}",
                  f"{r['step_s']:.3f} ({' / '.join(f'{x:.2f}' for x in r['round_medians_s'])})",
                  f"{r['tokens_per_s']:.0f}", _ratio(r["ratio_over_1x1"]), _ratio(r["ratio_over_1x2"], r["ranks"] == 2),
                  _gib(max(r["peak_rss_bytes_per_rank"]))] for r in steps]
        lines += [common.markdown_table(["shape", "parameters", "step", "ranks x threads", "s/step (runs)", "tokens/s",
                                         "time / 1x1", "time / 1x2", "peak RSS per rank (GiB)"], table), ""]
    memory = result.get("memory") or []
    if memory:
        m0 = memory[0]
        lines += [f"**Memory per rank.** {m0['shape']} shape ({m0['parameter_count'] / 1e6:.1f} M parameters, random "
                  f"weights), one SFT step on {m0['rows']} rows x {m0['tokens_per_row']} tokens, fp32 weights and AdamW; "
                  "1 rank unsharded, then 2 ranks sharded (FSDP2 per block). *Held*: parameters + gradients + AdamW "
                  "state the rank keeps (each part, and the step's seconds: the results file). Peak RSS (`getrusage`) "
                  "while building and sharding, then during the step. GiB.", ""]
        table = []
        for m in memory:
            for rank, r in enumerate(m["per_rank"]):
                table.append([f"{m['ranks']} ({'sharded' if m['sharded'] else 'unsharded'})", rank,
                              f"**{_gib(r['state_bytes'])}**", _gib(r["peak_rss_setup_bytes"]),
                              f"**{_gib(r['peak_rss_step_bytes'])}**"])
        lines += [common.markdown_table(["ranks", "rank", "held", "peak RSS build + shard", "peak RSS step"], table), ""]
        one, two = memory[0], memory[-1]
        if one["ranks"] == 1 and two["ranks"] == 2:
            held = max(r["state_bytes"] for r in two["per_rank"]) / one["per_rank"][0]["state_bytes"]
            peak = max(r["peak_rss_step_bytes"] for r in two["per_rank"]) / one["per_rank"][0]["peak_rss_step_bytes"]
            lines += [f"2 ranks sharded over 1 rank unsharded, the larger rank: held **{held:.2f}x**, peak RSS in the "
                      f"step **{peak:.2f}x**. Loss of the step {two['loss']:.6f} (2 ranks) and {one['loss']:.6f} (1 rank)."]
    return "\n".join(lines).rstrip()


def worker_main(argv: Sequence[str]) -> int:
    """``worker steps MODEL_DIR OUT [--steps N --warmup W]`` or ``worker memory SHAPE OUT``."""
    p = argparse.ArgumentParser(prog="bench.learner_ranks worker")
    sub = p.add_subparsers(dest="kind", required=True)
    s = sub.add_parser("steps")
    s.add_argument("model_dir", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--steps", type=int, default=3)
    s.add_argument("--warmup", type=int, default=1)
    m = sub.add_parser("memory")
    m.add_argument("shape", choices=list(MEMORY_SHAPES))
    m.add_argument("out", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.kind == "steps":
        steps_worker(args.model_dir, args.out, args.steps, args.warmup)
    else:
        memory_worker(args.shape, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list[:1] == ["worker"]:
        return worker_main(args_list[1:])
    p = common.parser(__doc__, common.RESULTS_DIR / "learner_ranks.json")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--steps", type=int, default=3, help="measured steps per layout (median)")
    p.add_argument("--warmup", type=int, default=1, help="steps before them, not counted")
    p.add_argument("--rounds", type=int, default=2, help="runs of every layout (alternating order)")
    p.add_argument("--skip-memory", action="store_true", help="leave out the memory part")
    p.add_argument("--memory-shape", default="qwen2-0.5b", choices=list(MEMORY_SHAPES), help="model of the memory part")
    args = p.parse_args(args_list)
    specs = batch_specs()
    result: dict[str, Any] = {"command": common.command_line("bench.learner_ranks", argv),
                              "batch_rows": len(specs), "batch_tokens": sum(a + b for a, b, _ in specs),
                              "micro_batch_size": MICRO_BATCH_SIZE, "steps_measured": args.steps, "warmup": args.warmup,
                              "rounds": args.rounds, "omp_wait_policy": OMP_WAIT_POLICY,
                              "layouts": [f"{r}x{t}" for r, t in LAYOUTS], "shapes": {k: SHAPES[k] for k in args.shapes}}
    with tempfile.TemporaryDirectory() as tmp:
        result["steps"] = measure_steps(args.shapes, args.steps, args.warmup, args.rounds, Path(tmp)) if args.shapes else []
        result["memory"] = [] if args.skip_memory else measure_memory(args.memory_shape, Path(tmp))
    result["machine"] = common.machine_info()
    common.publish_result(args.out, result, "learner_ranks", lambda: render(result), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    common.run_main("bench.learner_ranks", main)
