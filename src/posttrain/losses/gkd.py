"""GKD losses: the teacher's next-token distributions as the student's target (Agarwal et al., arXiv 2306.13649).

Notation: at a trained position ``t`` (a token whose ``loss_mask`` is True), ``S`` and ``T`` are
the student's and teacher's distributions over the vocabulary that predicted token ``x_t``, both
at temperature ``tau`` (``config.temperature``)::

    S = softmax(z_S[t - 1] / tau),   T = softmax(z_T[t - 1] / tau)         (the one-position shift:
                                                                            ``logprobs.predicting_logits``)

**Generalised JSD** (``generalized_jsd_loss``, the paper's eq. for D_JSD(beta), section 3)::

    M        = beta * T + (1 - beta) * S                                    (mixture)
    JSD_b    = beta * KL(T || M) + (1 - beta) * KL(S || M)                 0 < beta < 1
    JSD_0    = KL(T || S) = sum_v T_v (log T_v - log S_v)                  beta = 0: forward KL
    JSD_1    = KL(S || T) = sum_v S_v (log S_v - log T_v)                  beta = 1: reverse KL
    loss_sum = sum_t JSD_beta(t)                                            over trained positions

Convention: ``beta`` is the teacher's weight in the mixture, as in the paper (where D_JSD(beta)(P || Q)
takes P = teacher, Q = student) and in TRL's ``GKDTrainer``. JSD_beta itself tends to 0 at both ends
(its derivative in beta tends to the KLs: JSD_beta / beta -> KL(T || S) as beta -> 0, JSD_beta /
(1 - beta) -> KL(S || T) as beta -> 1), so like TRL we take those limits at beta = 0 and 1. The
paper's 0 < beta < 1 values are therefore small (0.034 nats at beta 0.5 where the KLs are 0.14 and
0.13 in ``tests/unit/losses/test_gkd_loss.py``): a learning rate tuned at an end needs raising in between.
Forward KL makes the student cover every mode of the teacher (mean seeking); reverse KL makes
it put its mass where the teacher's is high (mode seeking), what the paper found better with a
weaker student and on-policy samples. The gradient flows through ``S`` (also inside ``M``); ``T``
is detached.

**Sampled reverse KL**, the token-level "on-policy distillation" of tinker-cookbook and slime
(``sampled_reverse_kl_loss``): for a token ``x_t`` the student sampled,
``delta_t = log S(x_t) - log T(x_t)`` is a one-sample estimate of KL(S || T) at that position,
and ``E_{x~S}[grad log S(x) * (log S(x) - log T(x))]`` is that KL's gradient. So::

    w_t      = min(exp(clamp(log S(x_t) - behaviour_logprobs_t, -c, c)), is_cap)   (1 without behaviour)
    loss_t   = sg(w_t * delta_t) * (1 + log S(x_t) - sg(log S(x_t)))
    loss_sum = sum_t loss_t                                                over trained (sampled) tokens

``loss_t`` equals ``w_t * delta_t`` in value (an estimate of the reverse KL, what the metrics read)
and has gradient ``w_t * delta_t * grad log S(x_t)``: a policy gradient with per-token cost
``delta_t`` and no credit to later tokens (discount 0, as tinker). ``w_t`` is truncated importance
sampling against the generator's probability (Ionides 2008): 1 for a fresh on-policy token, and
it corrects a rollout sampled by an older student version. It needs only ``log T(x_t)``, one number
per token, where the JSD needs the teacher's whole distribution.

Deviations and choices:

* Losses are sums over trained tokens; the learner divides by the step's trained-token count
  (TRL's "batchmean" over the masked tokens).
* No ``tau**2`` factor (Hinton et al.'s distillation scaling): as in the paper and TRL.
* The paper samples a whole batch on-policy with probability lambda; the learner mixes within
  each batch instead (``gkd.lmbda``, ``posttrain.learner.gkd_step``).
* ``sampled_reverse_kl``: ``delta_t`` uses the learner's current log S(x_t), not the sampler's
  (tinker uses the sampler's); the importance weight is truncated (``is_cap``).
* A teacher whose vocabulary differs from the student's is refused (one line), not reconciled;
  a non-finite logit at a trained position raises instead of poisoning the step.

Run the tests: ``python -m pytest -q tests/unit/losses/test_gkd_loss.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.config import GKDLossConfig
from posttrain.losses.logprobs import predicting_logits
from posttrain.losses.types import LossOutput


@dataclass
class DistillLossInputs:
    """Per-token inputs of a distillation loss: both models' logits over the same token sequences.

    Attributes:
        student_logits: [B, T, V] float (fp32 or bf16). The student's outputs for ``token_ids``, with
            gradient; the distributions are taken in float32.
        teacher_logits: [B, T, V] float. The teacher's outputs for the same tokens (detached here).
        token_ids: [B, T] int64. The sequences (prompt, sampled or fixed answer tokens, padding).
        loss_mask: [B, T] bool. Tokens whose predicting distributions are compared: the student's
            sampled tokens of an on-policy rollout, the assistant tokens of a fixed sequence. Never
            True at position 0.
        behaviour_logprobs: [B, T] float32 or None. Log-probability (nats) the generator gave each
            sampled token (at the loss temperature); read by ``sampled_reverse_kl_loss`` for its
            importance weight. None: weight 1.

    Raises:
        ValueError: one line naming the field: a logits tensor is not 3-D floating point, the
            teacher's vocabulary (last dimension) differs from the student's, ``[B, T]`` differ,
            ``token_ids`` is not an integer tensor, ``loss_mask`` is not bool, or
            ``behaviour_logprobs`` is not float32 of shape ``[B, T]``.
    """

    student_logits: Tensor
    teacher_logits: Tensor
    token_ids: Tensor
    loss_mask: Tensor
    behaviour_logprobs: Tensor | None = None

    def __post_init__(self) -> None:
        for name in ("student_logits", "teacher_logits"):
            value = getattr(self, name)
            if not isinstance(value, Tensor) or value.dim() != 3 or not value.is_floating_point():
                raise ValueError(f"{name}: expected a floating-point [B, T, V] tensor, got {_describe(value)}")
        student_vocab, teacher_vocab = self.student_logits.shape[-1], self.teacher_logits.shape[-1]
        if teacher_vocab != student_vocab:
            raise ValueError(
                f"teacher_logits: vocabulary of {teacher_vocab} tokens differs from the student's {student_vocab}; "
                "distillation compares the two distributions token by token, so teacher and student need one tokenizer"
            )
        shape = self.student_logits.shape[:2]
        if self.teacher_logits.shape[:2] != shape:
            raise ValueError(f"teacher_logits: expected [B, T] = {tuple(shape)} like student_logits, "
                             f"got {tuple(self.teacher_logits.shape[:2])}")
        for name in ("token_ids", "loss_mask", "behaviour_logprobs"):
            value = getattr(self, name)
            if value is None and name == "behaviour_logprobs":
                continue
            if not isinstance(value, Tensor) or value.shape != shape:
                raise ValueError(f"{name}: expected shape {tuple(shape)} like student_logits[:, :, 0], got "
                                 f"{_describe(value)}")
        if self.token_ids.dtype.is_floating_point or self.token_ids.dtype == torch.bool:
            raise ValueError(f"token_ids: expected an integer dtype, got {self.token_ids.dtype}")
        if self.loss_mask.dtype != torch.bool:
            raise ValueError(f"loss_mask: expected dtype torch.bool, got {self.loss_mask.dtype}")
        if self.behaviour_logprobs is not None and self.behaviour_logprobs.dtype != torch.float32:
            raise ValueError(f"behaviour_logprobs: expected dtype torch.float32, got {self.behaviour_logprobs.dtype}")


@dataclass(frozen=True)
class _Distributions:
    """Both models' log-distributions at the N trained positions (float32), and the tokens there."""

    student: Tensor  # [N, V], with gradient
    teacher: Tensor  # [N, V], detached
    tokens: Tensor  # [N] int64


def _distributions(inputs: DistillLossInputs, temperature: float) -> _Distributions:
    """Gather the predicting rows, check them, divide by the temperature, log-softmax (float32)."""
    mask = inputs.loss_mask
    student = predicting_logits(inputs.student_logits, mask).float()
    teacher = predicting_logits(inputs.teacher_logits.detach(), mask).float()
    for name, rows in (("student_logits", student), ("teacher_logits", teacher)):
        bad = ~torch.isfinite(rows.detach()).all(dim=-1)
        if bool(bad.any()):
            b, t = (int(i) for i in mask.nonzero()[int(bad.nonzero()[0])])
            raise ValueError(f"{name}: non-finite value in the distribution predicting token (row {b}, position {t})")
    if temperature != 1.0:
        student, teacher = student / temperature, teacher / temperature
    return _Distributions(torch.log_softmax(student, dim=-1), torch.log_softmax(teacher, dim=-1),
                          inputs.token_ids[mask].long())


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) per row of [N, V] log-distributions: ``sum_v p_v (log p_v - log q_v)`` -> [N]."""
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def generalized_jsd(student: Tensor, teacher: Tensor, beta: float) -> Tensor:
    """JSD(beta) per row (module docstring): forward KL at beta 0, reverse KL at beta 1.

    Args:
        student: [N, V] float32 log-probabilities of the student, with gradient.
        teacher: [N, V] float32 log-probabilities of the teacher.
        beta: The teacher's weight in the mixture, in [0, 1].

    Returns:
        [N] float32 divergences (nats), >= 0.

    Raises:
        ValueError: ``beta`` outside [0, 1].
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta: must lie in [0, 1], got {beta}")
    if beta == 0.0:
        return _kl(teacher, student)
    if beta == 1.0:
        return _kl(student, teacher)
    mixture = torch.logsumexp(torch.stack([teacher + math.log(beta), student + math.log1p(-beta)]), dim=0)
    return beta * _kl(teacher, mixture) + (1.0 - beta) * _kl(student, mixture)


def _diagnostics(dist: _Distributions) -> dict[str, float]:
    """Metrics of both distributions at the trained positions, means per token (0.0 with none)."""
    n = int(dist.tokens.numel())
    if not n:
        return {key: 0.0 for key in ("gkd/forward_kl", "gkd/reverse_kl", "gkd/agreement", "gkd/teacher_logprob",
                                     "gkd/student_logprob")}
    with torch.no_grad():
        student, teacher = dist.student.detach(), dist.teacher
        picked = dist.tokens.unsqueeze(-1)
        return {
            "gkd/forward_kl": float(_kl(teacher, student).double().mean()),
            "gkd/reverse_kl": float(_kl(student, teacher).double().mean()),
            "gkd/agreement": float((student.argmax(dim=-1) == teacher.argmax(dim=-1)).double().mean()),
            "gkd/teacher_logprob": float(teacher.gather(-1, picked).double().mean()),
            "gkd/student_logprob": float(student.gather(-1, picked).double().mean()),
        }


def generalized_jsd_loss(inputs: DistillLossInputs, config: GKDLossConfig) -> LossOutput:
    """GKD's generalised JSD(beta) summed over trained positions (module docstring).

    Args:
        inputs: Student and teacher logits ``[B, T, V]``, ``token_ids`` and ``loss_mask`` ``[B, T]``;
            ``behaviour_logprobs`` is not read.
        config: ``beta`` and ``temperature``.

    Returns:
        ``LossOutput`` with ``num_tokens`` = trained positions and metrics (means per trained token,
        0.0 with none): ``gkd/divergence`` (the loss), ``gkd/forward_kl`` KL(T || S) and
        ``gkd/reverse_kl`` KL(S || T) (exact, over the vocabulary, at ``temperature``),
        ``gkd/agreement`` (share of positions where both models' most likely token is the same),
        ``gkd/teacher_logprob`` and ``gkd/student_logprob`` (of the tokens in ``token_ids``).

    Raises:
        ValueError: bad inputs (``DistillLossInputs``), a non-finite logit at a trained position, or
            ``loss_mask`` True at position 0.
    """
    dist = _distributions(inputs, config.temperature)
    per_token = generalized_jsd(dist.student, dist.teacher, config.beta)
    return _output(per_token, dist, {})


def sampled_reverse_kl_loss(inputs: DistillLossInputs, config: GKDLossConfig) -> LossOutput:
    """Token-level reverse KL on the student's sampled tokens, a policy-gradient cost (module docstring).

    Args:
        inputs: Student and teacher logits ``[B, T, V]``; ``token_ids`` whose ``loss_mask`` tokens the
            student sampled; ``behaviour_logprobs`` ``[B, T]`` (the generator's, at ``temperature``) for
            the importance weight, or None (weight 1).
        config: ``temperature``, ``is_cap`` and ``log_ratio_clamp``.

    Returns:
        ``LossOutput`` with ``num_tokens`` = sampled tokens and the metrics of ``generalized_jsd_loss``
        (``gkd/divergence`` is here the importance-weighted k1 estimate of KL(S || T), the loss per
        token), plus ``gkd/is_weight`` (mean weight) and ``gkd/is_truncated`` (share of tokens whose
        weight hit ``is_cap``).

    Raises:
        ValueError: as ``generalized_jsd_loss``, and NaN in ``behaviour_logprobs`` at a sampled token.
    """
    dist = _distributions(inputs, config.temperature)
    picked = dist.tokens.unsqueeze(-1)
    student_token = dist.student.gather(-1, picked).squeeze(-1)
    delta = (student_token - dist.teacher.gather(-1, picked).squeeze(-1)).detach()
    extra: dict[str, float] = {"gkd/is_weight": 1.0 if delta.numel() else 0.0, "gkd/is_truncated": 0.0}
    weight = torch.ones_like(delta)
    if inputs.behaviour_logprobs is not None:
        behaviour = inputs.behaviour_logprobs.detach()[inputs.loss_mask]
        if bool(torch.isnan(behaviour).any()):
            b, t = (int(i) for i in inputs.loss_mask.nonzero()[int(torch.isnan(behaviour).nonzero()[0])])
            raise ValueError(f"behaviour_logprobs: NaN at a sampled token (row {b}, position {t})")
        log_ratio = torch.clamp(student_token.detach() - behaviour, -config.log_ratio_clamp, config.log_ratio_clamp)
        ratio = torch.exp(log_ratio)
        weight = torch.clamp(ratio, max=config.is_cap)
        if delta.numel():
            extra = {"gkd/is_weight": float(weight.double().mean()),
                     "gkd/is_truncated": float((ratio >= config.is_cap).double().mean())}
    cost = weight * delta
    per_token = cost * (1.0 + student_token - student_token.detach())
    return _output(per_token, dist, extra)


def _output(per_token: Tensor, dist: _Distributions, extra: dict[str, float]) -> LossOutput:
    """``LossOutput`` of per-token losses ``[N]``: their sum, N, and the metrics."""
    n = int(per_token.numel())
    metrics = _diagnostics(dist)
    metrics["gkd/divergence"] = float(per_token.detach().double().sum()) / n if n else 0.0
    metrics.update(extra)
    return LossOutput(loss_sum=per_token.sum(), num_tokens=n, metrics=metrics)


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__


DISTILL_LOSSES: dict[str, Callable[[DistillLossInputs, GKDLossConfig], LossOutput]] = {
    "generalized_jsd": generalized_jsd_loss,
    "sampled_reverse_kl": sampled_reverse_kl_loss,
}
"""``gkd.loss.divergence`` -> its loss."""
