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

``RowTokenStats`` keeps the same split per rollout of the batch, for the learner's ledger: action
tokens that got policy gradient, that the staleness bound masked and that the DIS band masked,
and the oldest and newest policy version among the tokens that got gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posttrain.losses.kl import k3_kl
from posttrain.losses.logprobs import selected_entropies
from posttrain.losses.sao import DISBand
from posttrain.parallel.world import World

ROW_TOKEN_KEYS = ("trained_tokens", "stale_masked_tokens", "dis_masked_tokens", "trained_version_min",
                  "trained_version_max")
"""Keys of each ``RowTokenStats.rows`` entry (the ledger's per-rollout token accounting)."""


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


class RowTokenStats:
    """Per-rollout token accounting of one policy update, over every rank's micro-batches.

    Args:
        rows: B, the rollouts of the whole batch.
    """

    def __init__(self, rows: int) -> None:
        self.counts = torch.zeros((rows, 3), dtype=torch.float64)  # trained, stale-masked, DIS-masked
        self.oldest = torch.full((rows,), -torch.inf, dtype=torch.float64)  # -(min version); -inf: none
        self.newest = torch.full((rows,), -torch.inf, dtype=torch.float64)

    def add(self, batch_rows: Sequence[int], band: DISBand, token_versions: Tensor) -> None:
        """Add one micro-batch (a filler's must not be added).

        Args:
            batch_rows: The batch row of each of the micro-batch's rows (``len == b``).
            band: The DIS band of the micro-batch (``keep`` [b, T]: tokens that get policy gradient;
                ``stale``; ``below`` / ``above``: DIS-masked fresh tokens).
            token_versions: [b, T] int64. Policy version that sampled each token.
        """
        with torch.no_grad():
            index = torch.tensor(list(batch_rows), dtype=torch.long)
            keep = band.keep.cpu()
            versions = token_versions.cpu().double()
            self.counts[index, 0] += keep.sum(dim=1).double()
            self.counts[index, 1] += band.stale.cpu().sum(dim=1).double()
            self.counts[index, 2] += (band.below | band.above).cpu().sum(dim=1).double()
            oldest = torch.where(keep, -versions, torch.full_like(versions, -torch.inf)).amax(dim=1)
            newest = torch.where(keep, versions, torch.full_like(versions, -torch.inf)).amax(dim=1)
            self.oldest[index] = torch.maximum(self.oldest[index], oldest)
            self.newest[index] = torch.maximum(self.newest[index], newest)

    def rows(self, world: World) -> list[dict[str, float | None]]:
        """One dict per batch row (``ROW_TOKEN_KEYS``; versions None without a trained token), over all ranks.

        Every rank must call it (one ``world.sum`` and one ``world.max_floats``).
        """
        counts = world.sum(self.counts.flatten().tolist())
        extremes = world.max_floats(torch.cat([self.oldest, self.newest]).tolist())
        b = self.counts.shape[0]
        out: list[dict[str, float | None]] = []
        for i in range(b):
            trained, stale, dis = counts[3 * i : 3 * i + 3]
            oldest, newest = extremes[i], extremes[b + i]
            out.append({"trained_tokens": trained, "stale_masked_tokens": stale, "dis_masked_tokens": dis,
                        "trained_version_min": -oldest if trained else None,
                        "trained_version_max": newest if trained else None})
        return out


def empty_rows(rows: int) -> list[dict[str, float | None]]:
    """``RowTokenStats.rows`` of a batch no token of which got policy gradient (the critic warm-up)."""
    return [{"trained_tokens": 0.0, "stale_masked_tokens": 0.0, "dis_masked_tokens": 0.0, "trained_version_min": None,
             "trained_version_max": None} for _ in range(rows)]


TURN_KEYS = ("turn_advantage", "turn_value", "turn_return")
"""Per-turn diagnostics ``turn_diagnostics`` adds to each ledger rollout (``turn_value`` and ``turn_return`` with a
critic only): the mean advantage of the turn's action tokens, and the critic's value (before this step's critic
updates) and the critic's target return at the turn's first action token. Issue 29: advantage sign by turn, value
against return by the observation's ``left`` count."""


def turn_diagnostics(action_mask: Tensor, batch_rows: Sequence[int], batch_size: int, advantages: Tensor,
                     values: Tensor | None, returns: Tensor | None, world: World) -> list[dict[str, list[float]]]:
    """Per rollout of the batch and per action turn: mean advantage, value and return at the turn's first token.

    Args:
        action_mask: ``[b, T]`` bool, this rank's rows (``batch_rows[i]`` is row ``i``'s index in the batch).
        batch_rows: Batch index of each local row (empty when this rank has no row: its tensors are a filler).
        batch_size: B, the rollouts of the whole batch.
        advantages: ``[b, T']`` float (``T' >= T`` columns are cut), the advantages the policy loss uses.
        values: ``[b, T']`` float, the critic's values before its updates, or None without a critic.
        returns: ``[b, T']`` float, the critic's targets, or None without a critic.
        world: The ranks; every rank must call this (one ``world.sum``), each row is owned by one rank.

    Returns:
        One dict per batch row with ``turn_advantage`` (and with a critic ``turn_value`` and ``turn_return``), one
        float per action turn (rounded to 4 decimals), in turn order.
    """
    width = int(action_mask.shape[1])
    per_row: dict[int, list[tuple[float, float, float]]] = {}
    max_turns = 0
    mask = action_mask.detach().cpu().bool()
    adv = advantages[:, :width].detach().cpu().double()
    val = values[:, :width].detach().cpu().double() if values is not None else None
    ret = returns[:, :width].detach().cpu().double() if returns is not None else None
    for i, row in enumerate(batch_rows):
        m = mask[i]
        idx = torch.nonzero(m).flatten()
        if idx.numel() == 0:
            per_row[row] = []
            continue
        starts = torch.cat([idx[:1], idx[1:][idx[1:] != idx[:-1] + 1]])
        ends = torch.cat([idx[:-1][idx[1:] != idx[:-1] + 1], idx[-1:]]) + 1
        turns = []
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            turns.append((float(adv[i, s:e].mean()), float(val[i, s]) if val is not None else 0.0,
                          float(ret[i, s]) if ret is not None else 0.0))
        per_row[row] = turns
        max_turns = max(max_turns, len(turns))
    max_turns = int(world.max_floats([float(max_turns)])[0])
    counts = [0.0] * batch_size
    flat = [0.0] * (batch_size * max_turns * 3)
    for row, turns in per_row.items():
        counts[row] = float(len(turns))
        for t, triple in enumerate(turns):
            flat[(row * max_turns + t) * 3 : (row * max_turns + t) * 3 + 3] = triple
    summed = world.sum(counts + flat)
    counts, flat = summed[:batch_size], summed[batch_size:]
    out: list[dict[str, list[float]]] = []
    for row in range(batch_size):
        n = int(round(counts[row]))
        cells = [flat[(row * max_turns + t) * 3 : (row * max_turns + t) * 3 + 3] for t in range(n)]
        entry = {"turn_advantage": [round(c[0], 4) for c in cells]}
        if values is not None:
            entry["turn_value"] = [round(c[1], 4) for c in cells]
            entry["turn_return"] = [round(c[2], 4) for c in cells]
        out.append(entry)
    return out
