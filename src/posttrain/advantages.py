"""Advantage estimators: skip-observation GAE (SAO), group-relative (GRPO), critic-free baselines.

* ``skip_observation_gae``: token-level GAE over action tokens only, with the rollout's scalar
  reward on its last action token (SAO, arXiv 2607.07508 eqs. 4-5). ``length_adaptive_lambda``
  gives SAO's policy lambda = 1 - 1/(alpha * l) (VAPO, arXiv 2504.05118).
* ``group_relative_advantages``: GRPO's (r - mean_group) / (std_group + eps) (arXiv 2402.03300).
* ``batch_normalized_advantages``: critic-free whitening across a batch of different prompts
  (REINFORCE++ style), for ablations and smoke runs.
* ``RunningMeanBaseline``: the paper's weak baseline, A = r - mean(previous rewards).
* ``whiten``: (A - mean) / (std + eps) with given statistics, for optional whitening of any
  estimator's advantages (OpenRLHF; ``sao.whiten_advantages``).

All functions return ``[B, T]`` float32 advantages that are 0 on observation tokens, and never
build a graph (inputs are detached; work happens under ``torch.no_grad``).

Run the tests: ``python -m pytest -q tests/unit/test_advantages.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch
from torch import Tensor


def _check_mask(action_mask: Tensor, batch: int | None = None) -> None:
    if action_mask.dim() != 2 or action_mask.dtype != torch.bool:
        raise ValueError(
            f"action_mask: expected a [B, T] bool tensor, got shape {tuple(action_mask.shape)} "
            f"and dtype {action_mask.dtype}"
        )
    if batch is not None and action_mask.shape[0] != batch:
        raise ValueError(f"action_mask: expected {batch} rows like rewards, got {action_mask.shape[0]}")


def _check_rewards(rewards: Tensor) -> None:
    if rewards.dim() != 1 or not rewards.is_floating_point():
        raise ValueError(
            f"rewards: expected a [B] float tensor, got shape {tuple(rewards.shape)} and dtype {rewards.dtype}"
        )
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError(f"rewards: non-finite value at row {int((~torch.isfinite(rewards)).nonzero()[0])}")


def _broadcast(per_row: Tensor, action_mask: Tensor) -> Tensor:
    """[B] -> [B, T] float32, the row's value on its action tokens and 0 elsewhere."""
    values = per_row.detach().float().unsqueeze(1).expand(action_mask.shape)
    return torch.where(action_mask, values, torch.zeros((), dtype=torch.float32, device=values.device))


def skip_observation_gae(
    *,
    values: Tensor,
    rewards: Tensor,
    action_mask: Tensor,
    gamma: float,
    lam: float | Tensor,
) -> tuple[Tensor, Tensor]:
    """Token-level GAE that runs over action tokens only (SAO, arXiv 2607.07508 eqs. 4-5).

    For the action tokens ``t_1 < t_2 < ... < t_n`` of a row (possibly spread over several turns,
    with observation tokens between them), ``next(t_k) = t_{k+1}``::

        delta_t = r_t + gamma * V(next(t)) - V(t)          V(next(t_n)) = 0 (terminal)
        A_t     = delta_t + gamma * lam * A(next(t))        A(next(t_n)) = 0
        r_t     = reward of the rollout if t = t_n, else 0

    Observation tokens are skipped by the recursion (their values are never read) and get
    advantage and return 0. With ``gamma = 1`` and ``lam = 1``, ``A_t = reward - V(t)``.

    Args:
        values: [B, T] float. Critic values (any float dtype; computed in float32); only action
            tokens are read.
        rewards: [B] float32. Scalar reward of each rollout (placed on its last action token).
        action_mask: [B, T] bool. True on tokens sampled by the policy; padding is False.
        gamma: Discount per action token, in [0, 1].
        lam: GAE lambda in [0, 1]: a float for every row, or a [B] float tensor (one per row, e.g.
            ``length_adaptive_lambda``).

    Returns:
        ``(advantages, returns)``, both [B, T] float32, detached; ``returns = advantages + values``
        on action tokens; both 0 on observation and padding tokens.

    Raises:
        ValueError: bad shapes or dtypes (naming the field), ``gamma`` or ``lam`` outside [0, 1],
            non-finite rewards, or a row with no action token (its reward would be lost).
    """
    _check_rewards(rewards)
    _check_mask(action_mask, rewards.shape[0])
    if values.shape != action_mask.shape or not values.is_floating_point():
        raise ValueError(
            f"values: expected a float tensor of shape {tuple(action_mask.shape)} like action_mask, got "
            f"shape {tuple(values.shape)} and dtype {values.dtype}"
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma: must lie in [0, 1], got {gamma}")
    batch, length = action_mask.shape
    device = values.device
    with torch.no_grad():
        if isinstance(lam, Tensor):
            if lam.shape != (batch,):
                raise ValueError(f"lam: expected a float or a [{batch}] tensor, got shape {tuple(lam.shape)}")
            lam_rows = lam.detach().to(device=device, dtype=torch.float32)
        else:
            lam_rows = torch.full((batch,), float(lam), dtype=torch.float32, device=device)
        if not bool(((lam_rows >= 0) & (lam_rows <= 1)).all()):
            raise ValueError(f"lam: every value must lie in [0, 1], got {lam_rows.tolist()}")
        empty = ~action_mask.any(dim=1)
        if bool(empty.any()):
            raise ValueError(
                f"action_mask: row {int(empty.nonzero()[0])} has no action token, so its reward has no "
                "token to sit on"
            )

        values32 = values.detach().float()
        positions = torch.arange(length, device=device).expand(batch, length)
        last_action = torch.where(action_mask, positions, torch.full_like(positions, -1)).max(dim=1).values
        rewards32 = rewards.detach().float().to(device)
        discount = gamma * lam_rows

        advantages = torch.zeros((batch, length), dtype=torch.float32, device=device)
        next_value = torch.zeros(batch, dtype=torch.float32, device=device)
        next_advantage = torch.zeros(batch, dtype=torch.float32, device=device)
        for t in range(length - 1, -1, -1):
            is_action = action_mask[:, t]
            reward_t = torch.where(last_action == t, rewards32, torch.zeros_like(rewards32))
            delta = reward_t + gamma * next_value - values32[:, t]
            advantage_t = delta + discount * next_advantage
            advantages[:, t] = torch.where(is_action, advantage_t, torch.zeros_like(advantage_t))
            next_value = torch.where(is_action, values32[:, t], next_value)
            next_advantage = torch.where(is_action, advantage_t, next_advantage)
        returns = torch.where(action_mask, advantages + values32, torch.zeros_like(advantages))
    return advantages, returns


def length_adaptive_lambda(action_lengths: Tensor, alpha: float) -> Tensor:
    """SAO/VAPO length-adaptive policy lambda: ``1 - 1 / (alpha * l)``, clamped to [0, 1].

    VAPO (arXiv 2504.05118) introduced it with alpha = 0.05; SAO reproductions use alpha = 1.5
    (research notes §1.3). A row with ``l = 0`` gets 0.

    Args:
        action_lengths: [B] int. Action tokens of each rollout (tokens).
        alpha: Positive scale.

    Returns:
        [B] float32 lambdas in [0, 1].

    Raises:
        ValueError: ``alpha <= 0``, ``action_lengths`` not 1-D, or a negative length.
    """
    if not alpha > 0:
        raise ValueError(f"alpha: must be > 0, got {alpha}")
    if action_lengths.dim() != 1:
        raise ValueError(f"action_lengths: expected [B], got shape {tuple(action_lengths.shape)}")
    if action_lengths.numel() and int(action_lengths.min()) < 0:
        raise ValueError(f"action_lengths: lengths must be >= 0, got min {int(action_lengths.min())}")
    scaled = alpha * action_lengths.detach().double()
    lam = torch.where(scaled > 0, 1.0 - 1.0 / scaled.clamp(min=1e-300), torch.zeros_like(scaled))
    return lam.clamp(0.0, 1.0).float()


def batch_normalized_advantages(rewards: Tensor, action_mask: Tensor, eps: float = 1e-6) -> Tensor:
    """Critic-free advantages: rewards whitened across the batch, broadcast to action tokens.

    ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the unbiased std over the B rollouts (of
    different prompts; REINFORCE++ global normalisation, arXiv 2501.03262). With B = 1 the mean of
    one reward is the reward itself and every advantage would be 0 (the slime/open-instruct
    single-sample pitfall, research notes §3.2, §7.4), so a lone rollout gets its raw reward.
    A batch of B >= 2 equal rewards does give zeros: there is nothing to prefer.

    Args:
        rewards: [B] float32. Scalar reward of each rollout.
        action_mask: [B, T] bool. Action tokens.
        eps: Added to the standard deviation (reward units, >= 0).

    Returns:
        [B, T] float32 advantages, 0 on observation tokens.

    Raises:
        ValueError: bad shapes or dtypes, non-finite rewards, or ``eps < 0``.
    """
    _check_rewards(rewards)
    _check_mask(action_mask, rewards.shape[0])
    if eps < 0:
        raise ValueError(f"eps: must be >= 0, got {eps}")
    with torch.no_grad():
        r = rewards.detach().float()
        if r.shape[0] >= 2:
            r = (r - r.mean()) / (r.std(correction=1) + eps)
        return _broadcast(r, action_mask)


def whiten(advantages: Tensor, action_mask: Tensor, mean: float, std: float, eps: float = 1e-6) -> Tensor:
    """``(A - mean) / (std + eps)`` on action tokens, 0 elsewhere (OpenRLHF's advantage whitening).

    ``mean`` and ``std`` are given, not computed here, so a learner can pool them over every rank's
    trained tokens (``learner.rank_rows.reduce_moments``) and whiten each rank's rows alike.

    Args:
        advantages: [B, T] float. Advantages of any estimator.
        action_mask: [B, T] bool. Tokens that keep an advantage.
        mean: Mean of the advantages the statistics were taken over.
        std: Their standard deviation (>= 0).
        eps: Added to ``std`` (> 0), so a constant batch gives 0, not a division by zero.

    Returns:
        [B, T] float32, 0 off ``action_mask``.

    Raises:
        ValueError: ``action_mask`` is not a [B, T] bool tensor of ``advantages``' shape, ``std < 0``
            or ``eps <= 0``.
    """
    _check_mask(action_mask, int(advantages.shape[0]))
    if action_mask.shape != advantages.shape:
        raise ValueError(f"action_mask: expected shape {tuple(advantages.shape)} like advantages, "
                         f"got {tuple(action_mask.shape)}")
    if not std >= 0 or not eps > 0:
        raise ValueError(f"whiten: std must be >= 0 and eps > 0, got std={std}, eps={eps}")
    with torch.no_grad():
        out = (advantages.detach().float() - mean) / (std + eps)
        return torch.where(action_mask, out, torch.zeros((), dtype=torch.float32, device=out.device))


class RunningMeanBaseline:
    """The paper's weak critic-free baseline: ``A = r - mean(previous `window` rewards)``.

    SAO's ablation (arXiv 2607.07508 Table 3) subtracts the mean of recent rewards; the baseline
    lags when the reward distribution shifts. The mean is taken *before* this batch's rewards join
    the window, so a rollout never baselines against itself; an empty window gives baseline 0.

    Args:
        window: Number of most recent rewards (rollouts) the mean covers, >= 1.

    Raises:
        ValueError: ``window < 1``.
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window: must be >= 1, got {window}")
        self.window = window
        self._rewards: deque[float] = deque(maxlen=window)

    @property
    def baseline(self) -> float:
        """Mean of the rewards now in the window (0.0 when empty)."""
        return sum(self._rewards) / len(self._rewards) if self._rewards else 0.0

    def advantages(self, rewards: Tensor, action_mask: Tensor) -> Tensor:
        """Advantages of a batch against the current baseline, then add its rewards to the window.

        Args:
            rewards: [B] float32. Scalar reward of each rollout, in arrival order.
            action_mask: [B, T] bool. Action tokens.

        Returns:
            [B, T] float32, ``reward - baseline`` on action tokens, 0 elsewhere.

        Raises:
            ValueError: bad shapes or dtypes, or non-finite rewards.
        """
        _check_rewards(rewards)
        _check_mask(action_mask, rewards.shape[0])
        with torch.no_grad():
            out = _broadcast(rewards - self.baseline, action_mask)
        self._rewards.extend(float(r) for r in rewards.detach().cpu().tolist())
        return out

    def rewards(self) -> list[float]:
        """The rewards in the window, oldest first."""
        return [float(r) for r in self._rewards]

    def state_dict(self) -> dict[str, object]:
        """The window and its rewards, for checkpoints (plain python values)."""
        return {"window": self.window, "rewards": list(self._rewards)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore from ``state_dict()`` output.

        Raises:
            ValueError: the saved window differs from this baseline's, or ``rewards`` is not a list.
        """
        if state.get("window") != self.window:
            raise ValueError(f"window: checkpoint has {state.get('window')}, this baseline has {self.window}")
        saved = state.get("rewards")
        if not isinstance(saved, list):
            raise ValueError(f"rewards: expected a list in the saved state, got {type(saved).__name__}")
        self._rewards = deque((float(r) for r in saved), maxlen=self.window)


def group_relative_advantages(
    rewards: Tensor,
    group_ids: Sequence[str],
    action_mask: Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GRPO advantages: each rollout's reward relative to its group (DeepSeekMath, arXiv 2402.03300 §4.1.2).

    ``A_i = (r_i - mean_g) / (std_g + eps)`` (unbiased std over the group), or ``r_i - mean_g``
    with ``normalize_std=False`` (Dr. GRPO), broadcast to action tokens. A group whose rewards are
    all equal (including a group of one) has advantage 0 for every member and gives no gradient;
    ``degenerate`` flags those rows so the caller can drop and count them.

    Args:
        rewards: [B] float32. Scalar reward of each rollout.
        group_ids: B strings; rollouts of the same prompt share one.
        action_mask: [B, T] bool. Action tokens.
        normalize_std: Divide by the group's std.
        eps: Added to the std (reward units, >= 0).

    Returns:
        ``(advantages, degenerate)``: [B, T] float32 (0 on observations) and [B] bool.

    Raises:
        ValueError: ``len(group_ids) != B``, bad shapes or dtypes, non-finite rewards, or ``eps < 0``.
    """
    _check_rewards(rewards)
    _check_mask(action_mask, rewards.shape[0])
    if len(group_ids) != rewards.shape[0]:
        raise ValueError(f"group_ids: expected {rewards.shape[0]} ids like rewards, got {len(group_ids)}")
    if eps < 0:
        raise ValueError(f"eps: must be >= 0, got {eps}")
    with torch.no_grad():
        r = rewards.detach().double()
        index_of: dict[str, int] = {}
        index = torch.tensor([index_of.setdefault(g, len(index_of)) for g in group_ids], dtype=torch.long)
        index = index.to(r.device)
        groups = len(index_of)
        counts = torch.zeros(groups, dtype=torch.float64, device=r.device).index_add_(
            0, index, torch.ones_like(r)
        )
        sums = torch.zeros(groups, dtype=torch.float64, device=r.device).index_add_(0, index, r)
        mean = (sums / counts)[index]
        centred = r - mean
        squares = torch.zeros(groups, dtype=torch.float64, device=r.device).index_add_(
            0, index, centred * centred
        )
        variance = torch.where(counts > 1, squares / (counts - 1).clamp(min=1), torch.zeros_like(counts))[
            index
        ]
        minimum = torch.full((groups,), torch.inf, dtype=torch.float64, device=r.device).scatter_reduce_(
            0, index, r, reduce="amin"
        )
        maximum = torch.full((groups,), -torch.inf, dtype=torch.float64, device=r.device).scatter_reduce_(
            0, index, r, reduce="amax"
        )
        degenerate = (minimum == maximum)[index]
        advantage = centred / (variance.sqrt() + eps) if normalize_std else centred
        advantage = torch.where(degenerate, torch.zeros_like(advantage), advantage)
        return _broadcast(advantage, action_mask), degenerate
