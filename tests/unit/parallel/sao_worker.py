"""One SAO step (critic and policy) on a fixed batch, on however many ranks launched it; rank 0 writes the result.

Run as ``python sao_worker.py MODEL_DIR OUT_DIR [SAO_OVERRIDES_JSON]`` (one rank) or under
``torchrun --nproc_per_node N``; the optional JSON holds ``sao`` settings merged over the worker's.
Writes ``OUT_DIR/metrics.json`` (the step's metrics) and ``OUT_DIR/{policy,critic}.safetensors``
(the updated parameters, gathered from the FSDP2 shards).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from posttrain.config import LearnerConfig, SAOConfig
from posttrain.learner.batching import collate_rollouts
from posttrain.learner.critic import CriticModel
from posttrain.learner.optim import build_optimizer
from posttrain.learner.sao_step import sao_train_step
from posttrain.learner.types import Trainable
from posttrain.losses.logprobs import token_logprobs
from posttrain.models.hf import load_policy
from posttrain.parallel.placement import full_state_dict, prepare_model
from posttrain.parallel.world import init_world, shutdown_world
from posttrain.records import Rollout

# Five rollouts (odd, so one rank holds a filler micro-batch), of different lengths and rewards.
SPECS = [(5, 7, 1.0), (3, 4, 0.0), (6, 9, 1.0), (4, 2, 0.0), (2, 6, 1.0)]
LEARNER_VERSION, STALE_VERSION = 2, 0
"""The step trains at version 2 with tau 1: rollout 1 (version 0, 4 action tokens) is masked for staleness."""


def rollouts(model_dir: Path) -> list[Rollout]:
    """The fixed batch: prompt tokens, then action tokens whose behaviour logprobs are the start
    policy's own, shifted by up to +-0.1 nats, so most ratios fall inside the DIS band and some outside."""
    model = load_policy(model_dir).eval()
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (n_prompt, n_action, reward) in enumerate(SPECS):
        ids = torch.randint(3, vocab, (n_prompt + n_action,), generator=g).tolist()
        with torch.no_grad():
            own = token_logprobs(model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids]))[0, n_prompt:]
        lp = (own + 0.2 * (torch.rand(n_action, generator=g) - 0.5)).tolist()
        out.append(Rollout(rollout_id=f"r{i}", task_id=f"t{i}", env_name="synthetic_arith", token_ids=ids,
                           behaviour_logprobs=[0.0] * n_prompt + lp, action_mask=[False] * n_prompt + [True] * n_action,
                           reward=reward, policy_version=STALE_VERSION if i == 1 else LEARNER_VERSION))
    return out


def main(model_dir: Path, out_dir: Path, overrides: dict | None = None) -> None:
    """Build policy and critic from ``model_dir``, take one SAO step, write the result.

    ``overrides``: top-level ``sao`` keys (a ``critic`` or ``loss`` dict is merged into the worker's).
    """
    torch.manual_seed(0)
    learner = LearnerConfig(device="cpu")
    world = init_world(learner)
    settings: dict = {"micro_batch_size": 2, "critic": {"warmup_steps": 0, "updates_per_step": 2, "lr": 1e-3},
                      "optim": {"lr": 1e-3}, "max_staleness": 1}
    for key, value in (overrides or {}).items():
        settings[key] = {**settings.get(key, {}), **value} if isinstance(value, dict) else value
    config = SAOConfig.model_validate(settings)
    policy_model = prepare_model(load_policy(model_dir), world, learner)
    critic_model = prepare_model(CriticModel.from_policy_path(model_dir), world, learner)
    policy = Trainable(policy_model, *build_optimizer(policy_model, config.optim, 10))
    critic = Trainable(critic_model, *build_optimizer(critic_model, config.optim.model_copy(update={"lr": 1e-3}), 10))
    batch = collate_rollouts(rollouts(model_dir), 0)
    result = sao_train_step(policy=policy, critic=critic, batch=batch, config=config, iteration=0, world=world,
                            learner_version=LEARNER_VERSION)
    weights = {name: full_state_dict(t.model, world) for name, t in (("policy", policy), ("critic", critic))}
    if world.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "metrics.json").write_text(json.dumps(result.metrics), encoding="utf-8")
        (out_dir / "rows.json").write_text(json.dumps(result.row_tokens), encoding="utf-8")
        for name, sd in weights.items():
            save_file({k: v.contiguous() for k, v in sd.items()}, str(out_dir / f"{name}.safetensors"))
    shutdown_world()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else None)
