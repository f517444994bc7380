"""GPU checks (issue 19): bf16 on CUDA against fp32 on the CPU, learner tokens/s, 2-rank NCCL parity, gateway overhead.

``scripts/gpu_check.sh`` runs these parts one after the other, each under a time limit, then ``summary``:

- ``parity OUT``: an SFT step and an SAO step (critic values, 2 critic updates, the DIS policy update) on the same
  batch and start weights, once on the CPU in fp32 and once on ``--device`` (CUDA) with ``learner.precision=bf16``
  (``prepare_model``: bf16 autocast, fp32 master weights and AdamW state), for the tiny model and the Qwen2-0.5B
  shape (random weights built locally). Reported: the losses and their relative difference, and for the updated
  parameters the max and mean absolute difference and the cosine between the two updates.
- ``throughput OUT``: learner tokens/s of the SFT and SAO steps on ``--device`` in bf16 for the 0.5B shape (median
  step after warm-up; peak CUDA memory).
- ``ranks OUT``: with two or more GPUs, the SAO step on 2 ranks (``torchrun --standalone``, FSDP2 over NCCL) against
  1 rank on the same batch, fp32 both (``worker`` is one rank of it).
- ``summary OUT_DIR``: every part's JSON in ``OUT_DIR/gpu_check.json`` with the checks judged, and
  ``OUT_DIR/summary.txt``. The script's ``vllm`` part (``tests/gpu/test_vllm_cuda.py``) and ``gateway`` part
  (``bench.gateway --engine vllm``: gateway against direct engine time per generated token) are judged here too.

Tolerances (``LIMITS``): bf16 against fp32, relative loss difference < 2e-2 and cosine of the updates >= 0.9;
2 ranks against 1 (fp32 both), relative loss difference < 1e-4 and cosine >= 0.999; the gateway, its worst
ratio over the concurrency levels at most 1.2 (issue 33's goal). Every part: parameters finite,
and no coordinate's two updates differ by more than 2 x lr (AdamW's first step moves a coordinate by at most lr).

On a machine without CUDA, ``--device cpu`` runs the same code with bf16 autocast on the CPU (how the unit tests
check this script). Run: ``PYTHONPATH=src:. python scripts/gpu_check.py parity OUT.json [--device cuda]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file: bench/ (shared helpers) is importable from the repository root
    sys.path.insert(0, str(REPO))

from bench.learner_ranks import QWEN2_05B, make_rollouts, sft_rank_step  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"vocab_size": 1024, "hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
             "intermediate_size": 256, "tie_word_embeddings": False},
    "qwen2-0.5b": {"vocab_size": QWEN2_05B["vocab_size"], "hidden_size": QWEN2_05B["hidden_size"],
                   "num_layers": QWEN2_05B["num_hidden_layers"], "num_heads": QWEN2_05B["num_attention_heads"],
                   "num_kv_heads": QWEN2_05B["num_key_value_heads"], "intermediate_size": QWEN2_05B["intermediate_size"],
                   "tie_word_embeddings": True},
}
"""Model shapes (``build_tiny_model`` arguments), built locally with random weights."""
LR = 1e-4
"""AdamW learning rate of every checked step (policy and critic)."""
LIMITS = {"bf16_loss_rtol": 2e-2, "bf16_update_cosine_min": 0.9, "ranks_loss_rtol": 1e-4,
          "ranks_update_cosine_min": 0.999, "update_diff_max_over_lr": 2.0, "gateway_ratio_max": 1.2}
"""The tolerances of the checks (module docstring)."""
PARITY_SPECS = [(32, 48, 1.0), (24, 40, 0.0), (40, 24, 1.0), (16, 56, 0.0), (28, 36, 1.0)]
"""Parity batch: (prompt tokens, action tokens, reward) per rollout; five, so two ranks split it 3/2."""
THROUGHPUT_ROWS = 8
"""Throughput batch: 8 rollouts of ``--tokens`` tokens (default 1,024: a quarter prompt, the rest actions)."""


@dataclass
class StepOutcome:
    """One step's losses, its seconds and the parameters before and after (CPU, fp32)."""

    losses: dict[str, float]
    seconds: float
    start: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    after: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


# --- pure helpers ----------------------------------------------------------------------------------------------


def relative_difference(a: float, b: float) -> float:
    """``|a - b| / |b|`` (``|a - b|`` when b is 0)."""
    return abs(a - b) / abs(b) if b else abs(a - b)


def compare_updates(start: dict[str, torch.Tensor], a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                    lr: float) -> dict[str, Any]:
    """How far two optimizer steps from the same ``start`` landed apart.

    Returns:
        ``max_abs_diff`` and ``mean_abs_diff`` of the parameters after (over every coordinate), ``update_cosine``
        (cosine between ``a - start`` and ``b - start``; 1.0 when both are zero), ``max_abs_update`` (of ``b``),
        ``max_diff_over_lr`` and ``finite`` (both ``a`` and ``b``).

    Raises:
        ValueError: the three do not hold the same names and shapes.
    """
    if not (start.keys() == a.keys() == b.keys()):
        raise ValueError(f"parameter names differ: {sorted(set(a) ^ set(b) | set(a) ^ set(start))[:5]}")
    dot = na = nb = total = 0.0
    max_diff = sum_diff = max_update = 0.0
    finite = True
    f64 = torch.float64
    for name, s in start.items():
        x, y = a[name].float(), b[name].float()
        if x.shape != s.shape or y.shape != s.shape:
            raise ValueError(f"{name}: shapes {tuple(s.shape)}, {tuple(x.shape)}, {tuple(y.shape)}")
        finite = finite and bool(torch.isfinite(x).all() and torch.isfinite(y).all())
        ua, ub, d = x - s.float(), y - s.float(), (x - y).abs()
        dot += float((ua * ub).sum(dtype=f64))
        na, nb = na + float((ua * ua).sum(dtype=f64)), nb + float((ub * ub).sum(dtype=f64))
        if d.numel():
            max_diff, max_update = max(max_diff, float(d.max())), max(max_update, float(ub.abs().max()))
        sum_diff, total = sum_diff + float(d.sum(dtype=f64)), total + d.numel()
    cosine = 1.0 if na == nb == 0.0 else dot / max((na * nb) ** 0.5, 1e-300)
    return {"max_abs_diff": max_diff, "mean_abs_diff": sum_diff / max(total, 1), "update_cosine": cosine,
            "max_abs_update": max_update, "max_diff_over_lr": max_diff / lr, "finite": finite}


def judge(name: str, value: float, limit: float, *, at_most: bool) -> dict[str, Any]:
    """A check: ``value`` against ``limit`` (``at_most``: value < limit; else value >= limit)."""
    ok = value < limit if at_most else value >= limit
    return {"check": name, "value": value, "limit": f"{'<' if at_most else '>='} {limit:g}", "ok": bool(ok)}


def parity_checks(row: dict[str, Any], loss_rtol: float, cosine_min: float, tag: str) -> list[dict[str, Any]]:
    """The checks of one compared step.

    Each loss's relative difference, and per model the update cosine, the largest coordinate difference over lr
    and finiteness.
    """
    checks = [judge(f"{tag}: {k} relative difference", v, loss_rtol, at_most=True)
              for k, v in row["loss_relative_difference"].items()]
    for model, cmp in row["parameters"].items():
        checks.append(judge(f"{tag}: {model} update cosine", cmp["update_cosine"], cosine_min, at_most=False))
        checks.append(judge(f"{tag}: {model} max |diff| / lr", cmp["max_diff_over_lr"],
                            LIMITS["update_diff_max_over_lr"] * 1.01, at_most=True))
        checks.append({"check": f"{tag}: {model} parameters finite", "value": cmp["finite"], "limit": "true",
                       "ok": bool(cmp["finite"])})
    return checks


def compare_outcomes(ref: StepOutcome, other: StepOutcome) -> dict[str, Any]:
    """``other`` against ``ref``.

    The losses (and gradient norms) side by side and their relative differences (only the losses' are checked),
    and ``compare_updates`` per model.
    """
    rel = {k: relative_difference(other.losses[k], v) for k, v in ref.losses.items()}
    return {"losses": {k: {"reference": v, "checked": other.losses[k]} for k, v in ref.losses.items()},
            "loss_relative_difference": {k: v for k, v in rel.items() if k.startswith("loss/")},
            "other_relative_difference": {k: v for k, v in rel.items() if not k.startswith("loss/")},
            "seconds": {"reference": ref.seconds, "checked": other.seconds},
            "parameters": {m: compare_updates(ref.start[m], ref.after[m], other.after[m], LR) for m in ref.after}}


# --- the steps -------------------------------------------------------------------------------------------------


def build_model(shape: str, out_dir: Path) -> Path:
    """``SHAPES[shape]`` with random weights (seed 0), saved in ``out_dir`` unless already there.

    Policy and critic load from it; the parts of one run share it through ``--models``.
    """
    from posttrain.models.hf import build_tiny_model

    if (out_dir / "config.json").exists() and (out_dir / "model.safetensors").exists():
        return out_dir
    return build_tiny_model(out_dir, seed=0, max_position_embeddings=2048, **SHAPES[shape])


def rollouts_of(model_dir: Path, specs: Sequence[tuple[int, int, float]], device: str = "cpu") -> list[Any]:
    """``bench.learner_ranks.make_rollouts`` with the start policy of ``model_dir``."""
    from posttrain.models.hf import load_policy

    return make_rollouts(load_policy(model_dir), specs, device)


def _cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _world(device: str) -> Any:
    """A one-rank ``World`` on ``device`` (a process group only when torchrun started this process)."""
    from posttrain.config import LearnerConfig
    from posttrain.parallel.world import World, init_world

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return init_world(LearnerConfig(device="cuda" if device.startswith("cuda") else "cpu"))
    return World(device=torch.device(device))


def sft_steps(model_dir: Path, rollouts: Sequence[Any], device: str, precision: str, *, steps: int = 1,
              micro_batch_size: int = 2, keep: bool = True) -> StepOutcome:
    """``steps`` SFT steps on ``device`` in ``precision``: the rollouts' tokens, trained on their action tokens.

    Returns the first step's loss, the median step seconds (after the first when there are several) and, with
    ``keep``, the policy before and after (CPU, fp32).
    """
    from posttrain.config import LearnerConfig, OptimConfig
    from posttrain.learner.optim import build_optimizer, clip_and_step
    from posttrain.learner.packing import pack_examples
    from posttrain.learner.sft import TokenExample
    from posttrain.models.hf import load_policy
    from posttrain.parallel.placement import full_state_dict, prepare_model

    world = _world(device)
    torch.manual_seed(0)
    model = prepare_model(load_policy(model_dir), world, LearnerConfig(device=world.device.type, precision=precision))
    start = _cpu_state(model) if keep and not world.distributed else {}
    rows = pack_examples([TokenExample(list(r.token_ids), list(r.action_mask)) for r in rollouts], 4096, packing=False)
    optimizer, scheduler = build_optimizer(model, OptimConfig(lr=LR), steps)
    model.train()
    losses, times = [], []
    for _ in range(steps):
        _sync(world.device)
        t = time.perf_counter()
        losses.append(sft_rank_step(model, rows, world, pad_token_id=0, micro_batch_size=micro_batch_size))
        clip_and_step(model, optimizer, scheduler, 1.0)
        _sync(world.device)
        times.append(time.perf_counter() - t)
    after = {"policy": {k: v.float() for k, v in full_state_dict(model, world).items()}} if keep else {}
    return StepOutcome({"loss/sft": losses[0]}, statistics.median(times[1:] or times),
                       {"policy": start} if start else {}, after)


def sao_steps(model_dir: Path, rollouts: Sequence[Any], device: str, precision: str, *, steps: int = 1,
              micro_batch_size: int = 2, keep: bool = True) -> StepOutcome:
    """``steps`` SAO steps on ``device`` in ``precision``: critic values, 2 critic updates, the policy update.

    Returns the first step's losses and gradient norms, the median step seconds (after the first when there are
    several) and, with ``keep``, policy and critic before and after (CPU, fp32).
    """
    from posttrain.config import LearnerConfig, SAOConfig
    from posttrain.learner.batching import collate_rollouts
    from posttrain.learner.critic import CriticModel
    from posttrain.learner.optim import build_optimizer
    from posttrain.learner.sao_step import sao_train_step
    from posttrain.learner.types import Trainable
    from posttrain.models.hf import load_policy
    from posttrain.parallel.placement import full_state_dict, prepare_model

    world = _world(device)
    learner = LearnerConfig(device=world.device.type, precision=precision)
    torch.manual_seed(0)
    config = SAOConfig(batch_size=len(rollouts), micro_batch_size=micro_batch_size, optim={"lr": LR},
                       critic={"warmup_steps": 0, "updates_per_step": 2, "lr": LR})
    models = {"policy": prepare_model(load_policy(model_dir), world, learner),
              "critic": prepare_model(CriticModel.from_policy_path(model_dir), world, learner)}
    start = {k: _cpu_state(m) for k, m in models.items()} if keep and not world.distributed else {}
    policy, critic = (Trainable(m, *build_optimizer(m, config.optim, steps)) for m in models.values())
    batch = collate_rollouts(rollouts, 0)
    first: dict[str, float] = {}
    times = []
    for i in range(steps):
        _sync(world.device)
        t = time.perf_counter()
        metrics = sao_train_step(policy=policy, critic=critic, batch=batch, config=config, iteration=i, world=world).metrics
        _sync(world.device)
        times.append(time.perf_counter() - t)
        first = first or {k: metrics[k] for k in ("loss/policy", "loss/value", "policy/grad_norm", "critic/grad_norm")}
    after = ({k: {n: v.float() for n, v in full_state_dict(m, world).items()} for k, m in models.items()}
             if keep else {})
    return StepOutcome(first, statistics.median(times[1:] or times), start, after)


# --- the parts -------------------------------------------------------------------------------------------------


def parity(shapes: Sequence[str], device: str, models: Path,
           on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """SFT and SAO steps on ``device`` in bf16 against the CPU in fp32, per shape (module docstring).

    ``on_row(result so far)`` is called after each compared step (the script writes it, so a part stopped at its
    time limit keeps what it measured).
    """
    result: dict[str, Any] = {"part": "parity", "rows": [], "checks": [], "lr": LR,
                              "batch_tokens": sum(a + b for a, b, _ in PARITY_SPECS)}
    for shape in shapes:
        model_dir = build_model(shape, models / shape)
        rollouts = rollouts_of(model_dir, PARITY_SPECS)
        for name, fn in (("sft", sft_steps), ("sao", sao_steps)):
            ref = fn(model_dir, rollouts, "cpu", "fp32")
            row = {"shape": shape, "step": name, "device": device, **compare_outcomes(ref, fn(model_dir, rollouts, device, "bf16"))}
            del ref
            result["rows"].append(row)
            result["checks"] += parity_checks(row, LIMITS["bf16_loss_rtol"], LIMITS["bf16_update_cosine_min"],
                                              f"{shape} {name} bf16 {device} vs fp32 cpu")
            if on_row is not None:
                on_row(result)
    return result


def throughput(shape: str, device: str, steps: int, models: Path, tokens_per_row: int = 1024) -> dict[str, Any]:
    """Learner tokens/s of the SFT and SAO steps on ``device`` in bf16 (median of ``steps`` after one warm-up)."""
    model_dir = build_model(shape, models / shape)
    specs = [(tokens_per_row // 4, tokens_per_row - tokens_per_row // 4, float(i % 2)) for i in range(THROUGHPUT_ROWS)]
    rollouts = rollouts_of(model_dir, specs, device)
    tokens = sum(len(r.token_ids) for r in rollouts)
    rows = []
    for name, fn in (("sft", sft_steps), ("sao", sao_steps)):
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        out = fn(model_dir, rollouts, device, "bf16", steps=steps + 1, micro_batch_size=4, keep=False)
        peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
        rows.append({"shape": shape, "step": name, "device": device, "precision": "bf16", "batch_tokens": tokens,
                     "micro_batch_size": 4, "step_s": out.seconds, "tokens_per_s": tokens / out.seconds,
                     "peak_cuda_memory_bytes": peak, "losses": out.losses})
    return {"part": "throughput", "rows": rows, "checks": [], "steps_measured": steps}


def worker(model_dir: Path, out: Path, device: str, precision: str) -> None:
    """One rank of ``ranks``: one SAO step on the parity batch; rank 0 writes the losses and updated weights."""
    from safetensors.torch import save_file

    from posttrain.parallel.world import shutdown_world

    rollouts = rollouts_of(model_dir, PARITY_SPECS)
    result = sao_steps(model_dir, rollouts, device, precision)
    if int(os.environ.get("RANK", "0")) == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "losses.json").write_text(json.dumps({"losses": result.losses, "seconds": result.seconds}))
        for name, sd in result.after.items():
            save_file({k: v.contiguous() for k, v in sd.items()}, str(out / f"{name}.safetensors"))
    shutdown_world()


def _launch_worker(model_dir: Path, out: Path, ranks: int, device: str, precision: str) -> StepOutcome:
    from safetensors.torch import load_file

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    me = [str(Path(__file__).resolve()), "worker", str(model_dir), str(out), "--device", device, "--precision", precision]
    cmd = ([sys.executable, *me] if ranks == 1 else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), *me])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    saved = json.loads((out / "losses.json").read_text())
    after = {n: load_file(str(out / f"{n}.safetensors")) for n in ("policy", "critic")}
    return StepOutcome(saved["losses"], saved["seconds"], {}, after)


def ranks(device: str, precision: str, models: Path) -> dict[str, Any]:
    """The SAO step on 2 ranks (torchrun, FSDP2; NCCL on CUDA, gloo on the CPU) against 1 rank, tiny model.

    The one rank runs in this process (on ``cuda:0`` or the CPU), the two under ``torchrun --standalone``.
    """
    model_dir = build_model("tiny", models / "tiny")
    one = sao_steps(model_dir, rollouts_of(model_dir, PARITY_SPECS), device, precision)
    with tempfile.TemporaryDirectory() as tmp:
        two = _launch_worker(model_dir, Path(tmp) / "two", 2, device, precision)
    row = {"shape": "tiny", "step": "sao", "device": device, "precision": precision, "ranks": 2,
           **compare_outcomes(one, two)}
    checks = parity_checks(row, LIMITS["ranks_loss_rtol"], LIMITS["ranks_update_cosine_min"],
                           f"tiny sao 2 ranks vs 1 ({device}, {precision})")
    return {"part": "ranks", "rows": [row], "checks": checks}


# --- summary ---------------------------------------------------------------------------------------------------


def gateway_check(result: dict[str, Any]) -> dict[str, Any]:
    """The gateway's worst ratio judged against ``LIMITS["gateway_ratio_max"]`` (at most).

    The ratio is gateway / direct seconds per generated token, the worst over every row of ``bench.gateway``'s results.

    Raises:
        KeyError: a row without ``ratio``, ``concurrency`` or ``layout``.
    """
    worst = max(result["rows"], key=lambda r: r["ratio"])
    name = (f"gateway / direct time per token, worst ({result.get('engine', '?')} engine, "
            f"{worst['layout']} layout, {worst['concurrency']} concurrent)")
    return judge(name, float(worst["ratio"]), LIMITS["gateway_ratio_max"] + 1e-12, at_most=True)


def gateway_lines(result: dict[str, Any]) -> list[str]:
    """One summary line per row of ``bench.gateway``'s results.

    Each: layout, concurrency, ms per generated token direct and through the gateway, and their ratio.
    """
    return [f"gateway   {r['layout']} {r['concurrency']} concurrent ({result.get('engine', '?')} engine): ms/token "
            f"direct {r['direct_ms_per_token']:.3f}, gateway {r['gateway_ms_per_token']:.3f}, ratio {r['ratio']:.2f}"
            for r in result.get("rows", [])]


def _machine() -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    return info


def summarize(out_dir: Path, ranks_expected: bool = False) -> tuple[dict[str, Any], str]:
    """Every part's JSON of ``out_dir`` in one result with every check, and the text summary.

    The parts are ``parity``, ``throughput``, ``vllm``, ``gateway`` and, with ``ranks_expected`` (two or more
    GPUs), ``ranks``; one that wrote nothing is listed as missing (its log is in ``out_dir``).
    """
    parts: dict[str, Any] = {}
    expected = ["parity", "throughput", "vllm", "gateway"] + (["ranks"] if ranks_expected else [])
    for name in expected:
        path = out_dir / f"{name}.json"
        parts[name] = json.loads(path.read_text()) if path.exists() else None
    checks = [c for p in parts.values() if isinstance(p, dict) for c in p.get("checks", [])]
    vllm = parts["vllm"]
    if isinstance(vllm, list) and vllm:
        last = vllm[-1]
        checks.append(judge("vllm bf16 vs cuda learner: mean |logprob diff|", last["parity_mean_abs_diff"], 0.01 + 1e-12,
                            at_most=True))
        checks.append(judge("vllm bf16 vs cuda learner: max |logprob diff|", last["parity_max_abs_diff"], 0.1 + 1e-12,
                            at_most=True))
    gateway = parts["gateway"]
    if isinstance(gateway, dict) and gateway.get("rows"):
        checks.append(gateway_check(gateway))
    lines = [f"GPU check, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: torch {torch.__version__}, "
             f"GPUs: {', '.join(_machine()['gpus']) or 'none'}"]
    lines += [f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}: {c['value']:.3g} ({c['limit']})"
              if isinstance(c["value"], float) else f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}" for c in checks]
    for row in (parts["throughput"] or {}).get("rows", []):
        mem = row["peak_cuda_memory_bytes"]
        lines.append(f"tokens/s  {row['shape']} {row['step']} {row['precision']} on {row['device']}: "
                     f"{row['tokens_per_s']:.0f} ({row['step_s']:.3f} s/step for {row['batch_tokens']} tokens"
                     + (f", peak {mem / 2**30:.1f} GiB)" if mem else ")"))
    if isinstance(vllm, list) and vllm:
        lines.append(f"vllm      decode tokens/s: batch 1 {vllm[-1].get('batch_1_tokens_per_s')}, "
                     f"batch 32 {vllm[-1].get('batch_32_tokens_per_s')}")
    if isinstance(gateway, dict):
        lines += gateway_lines(gateway)
    lines += [f"MISSING   {name} (see {name}.log)" for name, p in parts.items() if p is None]
    if "ranks" not in parts:
        lines.append("NOT RUN   ranks (needs 2 GPUs)")
    result = {"machine": _machine(), "limits": LIMITS, "parts": parts, "checks": checks,
              "all_ok": bool(checks) and all(c["ok"] for c in checks),
              "missing": [name for name, p in parts.items() if p is None]}
    return result, "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="part", required=True)
    for name in ("parity", "throughput", "ranks"):
        s = sub.add_parser(name)
        s.add_argument("out", type=Path)
        s.add_argument("--device", default="cuda", help="cuda (default), or cpu to check this script without a GPU")
        s.add_argument("--models", type=Path, help="where the models are built, or found from an earlier part")
    sub.choices["parity"].add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    sub.choices["throughput"].add_argument("--shape", default="qwen2-0.5b", choices=list(SHAPES))
    sub.choices["throughput"].add_argument("--steps", type=int, default=5)
    sub.choices["throughput"].add_argument("--tokens", type=int, default=1024, help="tokens per rollout (8 a step)")
    sub.choices["ranks"].add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    w = sub.add_parser("worker")
    w.add_argument("model_dir", type=Path)
    w.add_argument("out", type=Path)
    w.add_argument("--device", default="cuda")
    w.add_argument("--precision", default="fp32")
    s = sub.add_parser("summary")
    s.add_argument("out_dir", type=Path)
    s.add_argument("--ranks", action="store_true", help="the ranks part was due (two or more GPUs)")
    args = p.parse_args(argv)
    if args.part == "worker":
        worker(args.model_dir, args.out, args.device, args.precision)
        return 0
    if args.part == "summary":
        result, text = summarize(args.out_dir, args.ranks)
        (args.out_dir / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out_dir / "summary.txt").write_text(text)
        print(text, end="")
        return 0 if result["all_ok"] and not result["missing"] else 1
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"{args.part}: no CUDA device (torch {torch.__version__}); use --device cpu to check the script", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write(result: dict[str, Any]) -> None:
        args.out.write_text(json.dumps({**result, "machine": _machine()}, indent=2) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        models = args.models or Path(tmp)
        if args.part == "parity":
            result = parity(args.shapes, args.device, models, on_row=write)
        elif args.part == "throughput":
            result = throughput(args.shape, args.device, args.steps, models, args.tokens)
        else:
            result = ranks(args.device, args.precision, models)
    write(result)
    for c in result["checks"]:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}: {c['value']} ({c['limit']})")
    return 0 if all(c["ok"] for c in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
