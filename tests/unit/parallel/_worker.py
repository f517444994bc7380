"""One optimizer step of a technique on a fixed batch, as one process or as N ranks under torchrun.

``test_fsdp_parity.py`` runs this file twice on the same tiny model and compares what rank 0
writes (the SAO step has its own worker, ``sao_worker.py``)::

    python tests/unit/parallel/_worker.py --model DIR --out OUT --technique sft --technique dpo
    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/unit/parallel/_worker.py \
        --model DIR --out OUT --technique sft

For each ``--technique`` (``sft``, ``dpo``, ``gkd``; a fresh model each; add one to ``TECHNIQUES``) rank 0 writes
``OUT/<technique>/result.json`` (``world_size``, ``loss``, ``grad_norm``: the policy's pre-clip
gradient norm over all shards, ``metrics``: the step's metrics) and
``OUT/<technique>/weights.safetensors`` (the updated full weights, keys ``<part>.<name>``:
``policy.`` and any other trained part). The batch is built from seeded generators only, so it is the same on
every rank and in every launch. The optimizer is plain SGD (lr 0.05, no clipping: ``grad_clip``
1000): an update is then the gradient times the learning rate, so equal updates mean equal
gradients (AdamW's first step, ``lr * g / |g|``, would hide a wrong loss scale).

``run_worker`` (imported by the tests) launches it and reads the results back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve()
SRC = WORKER.parents[3] / "src"
LR = 0.05


@dataclass
class WorkerResult:
    """What rank 0 wrote for one technique.

    Attributes:
        world_size: Ranks that trained.
        loss: The step's loss (mean over the step's tokens or pairs, over all ranks).
        grad_norm: Pre-clip gradient norm of the policy.
        metrics: The step's metrics as the technique's step returned them.
        weights: Updated full weights, ``<part>.<name>`` (``policy.<name>``...).
    """

    world_size: int
    loss: float
    grad_norm: float
    metrics: dict[str, float]
    weights: dict[str, Any]


def run_worker(model_dir: Path, out_dir: Path, techniques: list[str], nproc: int = 1,
               timeout: float = 300) -> dict[str, WorkerResult]:
    """Run this worker as one process (``nproc`` 1) or under torchrun with ``nproc`` ranks (gloo, CPU).

    Raises:
        AssertionError: the worker failed (its output is in the message).
    """
    from safetensors.torch import load_file

    args = ["--model", str(model_dir), "--out", str(out_dir)]
    for t in techniques:
        args += ["--technique", t]
    if nproc == 1:
        cmd = [sys.executable, str(WORKER), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(WORKER), *args]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")])),
               TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    out = {}
    for t in techniques:
        info = json.loads((out_dir / t / "result.json").read_text(encoding="utf-8"))
        out[t] = WorkerResult(info["world_size"], info["loss"], info["grad_norm"], info["metrics"],
                              load_file(str(out_dir / t / "weights.safetensors")))
    return out


# --- the worker process ---------------------------------------------------------------------------


def _sgd(model: Any) -> Any:
    import torch

    from posttrain.learner.types import Trainable

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=LR)
    return Trainable(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0))


def _sft(model_dir: Path, world: Any, learner: Any) -> tuple[dict[str, Any], dict[str, float], float]:
    """Five packed rows of random tokens (micro-batches of 2: on 2 ranks rank 1 runs a filler)."""
    import torch

    from posttrain.learner.optim import clip_and_step
    from posttrain.learner.packing import pack_examples, sft_step
    from posttrain.learner.sft import TokenExample
    from posttrain.models.hf import load_policy
    from posttrain.parallel.placement import prepare_model

    gen = torch.Generator().manual_seed(1)
    examples = []
    for n in (9, 17, 5, 23, 12, 30, 7, 14):
        ids = torch.randint(5, 500, (n,), generator=gen).tolist()
        mask = torch.rand(n, generator=gen).lt(0.8).tolist()
        examples.append(TokenExample(ids, mask))
    rows = pack_examples(examples, 32)
    assert len(rows) == 5, [len(r) for r in rows]
    policy = _sgd(prepare_model(load_policy(model_dir), world, learner))
    policy.model.train()
    acc = sft_step(policy.model, rows, pad_token_id=0, micro_batch_size=2, world=world)
    metrics = acc.metrics("loss/sft")
    norm = clip_and_step(policy.model, policy.optimizer, policy.scheduler, 1000.0)
    return {"policy": policy.model}, {**metrics, "loss": metrics["loss/sft"], "sft/tokens": float(acc.num_tokens)}, norm


def _dpo(model_dir: Path, world: Any, learner: Any) -> tuple[dict[str, Any], dict[str, float], float]:
    """Five preference pairs; the reference is the start model, sharded and frozen."""
    import torch

    from posttrain.config.techniques import DPOTechniqueConfig
    from posttrain.learner.dpo import PairTokens, dpo_step, reference_logprobs
    from posttrain.learner.optim import clip_and_step
    from posttrain.models.hf import load_policy
    from posttrain.parallel.placement import prepare_model

    gen = torch.Generator().manual_seed(2)
    pairs = []
    for n in (3, 6, 4, 8, 5):
        prompt = torch.randint(5, 500, (4 + n % 3,), generator=gen).tolist()
        chosen = torch.randint(5, 500, (n,), generator=gen).tolist()
        rejected = torch.randint(5, 500, (n + 2,), generator=gen).tolist()
        pairs.append(PairTokens(prompt + chosen, [False] * len(prompt) + [True] * n,
                                prompt + rejected, [False] * len(prompt) + [True] * (n + 2)))
    config = DPOTechniqueConfig(micro_batch_size=2)
    reference = prepare_model(load_policy(model_dir), world, learner, trainable=False)
    ref = reference_logprobs(reference, pairs, pad_token_id=0, micro_batch_size=2, world=world) - 0.3
    policy = _sgd(prepare_model(load_policy(model_dir), world, learner))
    policy.model.train()
    acc = dpo_step(policy.model, pairs, ref, config, pad_token_id=0, world=world)
    metrics = acc.metrics("loss/dpo")
    norm = clip_and_step(policy.model, policy.optimizer, policy.scheduler, 1000.0)
    return ({"policy": policy.model},
            {**metrics, "loss": metrics["loss/dpo"], "dpo/pairs": float(acc.num_tokens),
             "ref_sum": float(ref.sum())}, norm)


def _gkd(model_dir: Path, world: Any, learner: Any) -> tuple[dict[str, Any], dict[str, float], float]:
    """Three on-policy rollouts and two fixed sequences; the teacher is the start model with seeded noise on every
    weight, frozen and sharded like the student; forward KL (beta 0: JSD saturates between distant random models, so its
    gradient would be too small to show a wrong scale) at temperature 1.5."""
    import torch

    from posttrain.config.techniques import GKDTechniqueConfig
    from posttrain.learner.gkd_step import gkd_train_step, mixed_batch
    from posttrain.learner.sft import TokenExample
    from posttrain.models.hf import load_policy
    from posttrain.parallel.placement import prepare_model
    from posttrain.records import Rollout

    gen = torch.Generator().manual_seed(3)
    rollouts = []
    for i, (n_prompt, n_action) in enumerate(((5, 7), (3, 4), (6, 9))):
        ids = torch.randint(5, 500, (n_prompt + n_action,), generator=gen).tolist()
        lp = (-torch.rand(n_action, generator=gen)).tolist()
        rollouts.append(Rollout(rollout_id=f"r{i}", task_id=f"t{i}", env_name="synthetic_arith", token_ids=ids,
                                behaviour_logprobs=[0.0] * n_prompt + lp,
                                action_mask=[False] * n_prompt + [True] * n_action, reward=float(i % 2),
                                policy_version=0))
    fixed = [TokenExample(torch.randint(5, 500, (n,), generator=gen).tolist(), [False] * 3 + [True] * (n - 3))
             for n in (8, 11)]
    teacher_model = load_policy(model_dir)
    with torch.no_grad():
        for p in teacher_model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen))
    teacher = prepare_model(teacher_model, world, learner, trainable=False)
    config = GKDTechniqueConfig(micro_batch_size=2, batch_size=5, loss={"beta": 0.0, "temperature": 1.5},
                                optim={"grad_clip": 1000.0})
    policy = _sgd(prepare_model(load_policy(model_dir), world, learner))
    result = gkd_train_step(policy=policy, teacher=teacher, batch=mixed_batch(rollouts, fixed, 0, 0), on_policy_rows=3,
                            config=config, world=world)
    metrics = {k: v for k, v in result.metrics.items() if k not in ("batch/padded_tokens", "policy/lr")}
    return {"policy": policy.model}, {**metrics, "loss": metrics["loss/gkd"]}, metrics["policy/grad_norm"]


TECHNIQUES: dict[str, Callable[[Path, Any, Any], tuple[dict[str, Any], dict[str, float], float]]] = {
    "sft": _sft, "dpo": _dpo, "gkd": _gkd,
}
"""Technique -> ``fn(model_dir, world, learner_config) -> ({part: model}, metrics with "loss", grad_norm)``."""


def main(argv: list[str] | None = None) -> int:
    import torch
    from safetensors.torch import save_file

    from posttrain.config.sections import LearnerConfig
    from posttrain.parallel.placement import full_state_dict
    from posttrain.parallel.world import init_world, shutdown_world

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--technique", action="append", choices=sorted(TECHNIQUES), required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    learner = LearnerConfig(device="cpu", precision="fp32")
    world = init_world(learner)
    try:
        for technique in args.technique:
            torch.manual_seed(0)
            parts, metrics, norm = TECHNIQUES[technique](args.model, world, learner)
            weights = {f"{name}.{k}": v.contiguous().clone()
                       for name, model in parts.items() for k, v in full_state_dict(model, world).items()}
            if world.is_main:
                out = args.out / technique
                out.mkdir(parents=True, exist_ok=True)
                save_file(weights, str(out / "weights.safetensors"))
                (out / "result.json").write_text(json.dumps({
                    "world_size": world.size, "loss": metrics["loss"], "grad_norm": norm, "metrics": metrics,
                }, indent=1), encoding="utf-8")
            world.barrier()
    finally:
        shutdown_world()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
