"""Per-token diagnostics of a policy update, pooled over micro-batches and ranks.

* ``policy/entropy``: mean entropy (nats) of the current policy's next-token distribution over the
  tokens that get policy gradient: action tokens inside the DIS band (SAO; GRPO with
  ``loss.dis_mask``), or every trained action token (GRPO without DIS). A collapse toward 0 is the
  usual early sign of an over-confident policy.
* The train/behaviour mismatch split by the DIS mask (as prime-rl's masked / unmasked mismatch
  KL): ``mismatch/k3_kl_unmasked`` and ``mismatch/k3_kl_masked`` (k3 estimate of
  KL(pi_behav || pi_theta), nats per token), ``mismatch/logprob_abs_diff_unmasked`` and
  ``..._masked`` (mean |logprobs - behaviour_logprobs|, each term capped at the log-ratio clamp).
  The masked tokens are the ones the band dropped; the unmasked ones are those that trained. Each
  is 0.0 when it has no token (every masked metric without DIS).

Each micro-batch adds sums and counts (``PolicyTokenStats.add``); ``metrics`` sums them over the
ranks (``world.sum``) and divides once, so the values do not depend on the micro-batch size or
the number of ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.losses.kl import k3_kl
from posttrain.losses.logprobs import selected_entropies
from posttrain.losses.sao import DISBand
from posttrain.parallel.world import World


class PolicyTokenStats:
    """Sums for ``policy/entropy`` and the masked / unmasked mismatch metrics (module docstring).

    Args:
        log_ratio_clamp: Bound on ``|log r|`` (nats), as in the loss.
        temperature: The behaviour policy's sampling temperature (the entropy is of that distribution).
    """

    def __init__(self, log_ratio_clamp: float, temperature: float = 1.0) -> None:
        self.clamp, self.temperature = log_ratio_clamp, temperature
        # trained tokens, their entropy; unmasked n, k3, |diff|; masked n, k3, |diff|
        self.sums = [0.0] * 8

    def add(self, logits: Tensor, logprobs: Tensor, behaviour_logprobs: Tensor, action_mask: Tensor,
            band: DISBand | None) -> None:
        """Add one micro-batch (a filler's must not be added).

        Args:
            logits: [B, T, V] float. The policy's outputs for the micro-batch.
            logprobs: [B, T] float32. The current policy's log-probabilities (``token_logprobs``).
            behaviour_logprobs: [B, T] float32. The generator's.
            action_mask: [B, T] bool. Action tokens of the rows that train.
            band: The DIS band on these tokens, or None without DIS (every action token trains).
        """
        with torch.no_grad():
            trained = band.keep if band is not None else action_mask
            masked = action_mask & ~trained
            entropy = selected_entropies(logits, trained, self.temperature)
            self.sums[0] += float(entropy.numel())
            self.sums[1] += float(entropy.double().sum())
            for offset, mask in ((2, trained), (5, masked)):
                current = logprobs.detach()[mask].double()
                behaviour = behaviour_logprobs.detach()[mask].double()
                log_ratio = torch.clamp(current - behaviour, -self.clamp, self.clamp)
                self.sums[offset] += float(mask.sum())
                self.sums[offset + 1] += float(k3_kl(behaviour, current, clamp=self.clamp).sum())
                self.sums[offset + 2] += float(log_ratio.abs().sum())

    def metrics(self, world: World) -> dict[str, float]:
        """The metrics over every rank's micro-batches (one ``world.sum``; every rank must call it)."""
        n, entropy, n_kept, k3_kept, diff_kept, n_masked, k3_masked, diff_masked = world.sum(self.sums)

        def mean(total: float, count: float) -> float:
            return total / count if count else 0.0

        return {
            "policy/entropy": mean(entropy, n),
            "mismatch/k3_kl_unmasked": mean(k3_kept, n_kept),
            "mismatch/k3_kl_masked": mean(k3_masked, n_masked),
            "mismatch/logprob_abs_diff_unmasked": mean(diff_kept, n_kept),
            "mismatch/logprob_abs_diff_masked": mean(diff_masked, n_masked),
        }
