"""Per-token log-probabilities and entropies from logits: the one place the position shift happens.

A causal LM's logits at position ``t - 1`` predict ``token_ids[:, t]``. Every other module works
with tensors aligned to ``token_ids`` (position ``t`` describes token ``t``); only
``token_logprobs``, ``entropy_from_logits`` and ``predicting_logits`` (the rows of logits that
predicted chosen tokens, for losses over whole distributions) look at logits. Position 0 has no
prediction and gets 0.0. The log-softmax runs in float32 even for bf16 logits, so the learner's numbers are
comparable with the generator's ``behaviour_logprobs``.

Run the tests: ``python -m pytest -q tests/unit/losses/test_token_logprobs.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _shifted_scaled_logits(logits: Tensor, temperature: float) -> Tensor:
    if logits.dim() != 3:
        raise ValueError(f"logits: expected [B, T, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits: expected a floating-point dtype, got {logits.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature: must be > 0, got {temperature}")
    scaled = logits[:, :-1, :].float()
    if temperature != 1.0:
        scaled = scaled / temperature
    return scaled


def token_logprobs(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each token given the tokens before it.

    ``out[b, t] = log softmax(logits[b, t - 1] / temperature)[token_ids[b, t]]`` for ``t >= 1``
    and ``out[b, 0] = 0.0``. Computed as ``logit - logsumexp(logits)`` in float32, which never
    materialises the full log-softmax.

    Args:
        logits: [B, T, V] float (float32, bf16 or fp16). Model outputs for ``token_ids``.
        token_ids: [B, T] int64. The tokens whose probabilities are wanted (prompt, actions and
            observations, in order).
        temperature: Sampling temperature the behaviour policy used (> 0); logits are divided by
            it. SAO samples at 1.0.

    Returns:
        [B, T] float32 log-probabilities (nats), differentiable w.r.t. ``logits``.

    Raises:
        ValueError: ``logits`` is not 3-D floating point, ``token_ids`` is not an integer
            ``[B, T]`` tensor matching ``logits``, a token id lies outside ``[0, V)``, or
            ``temperature <= 0``.
    """
    scaled = _shifted_scaled_logits(logits, temperature)
    batch, length, vocab = logits.shape
    if token_ids.shape != (batch, length):
        raise ValueError(
            f"token_ids: expected shape {(batch, length)} like logits[:, :, 0], got {tuple(token_ids.shape)}"
        )
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids: expected an integer dtype, got {token_ids.dtype}")
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab):
        raise ValueError(
            f"token_ids: values must lie in [0, {vocab}) (vocabulary of logits), got range "
            f"[{int(token_ids.min())}, {int(token_ids.max())}]"
        )
    targets = token_ids[:, 1:].long().unsqueeze(-1)
    picked = scaled.gather(-1, targets).squeeze(-1)
    shifted = picked - torch.logsumexp(scaled, dim=-1)
    first = torch.zeros((batch, min(length, 1)), dtype=torch.float32, device=logits.device)
    return torch.cat([first, shifted], dim=1)


def selected_entropies(logits: Tensor, mask: Tensor, temperature: float = 1.0, chunk_tokens: int = 1024) -> Tensor:
    """Entropies of the next-token distributions that produced the tokens where ``mask`` is True (no gradient).

    The value for token ``(b, t)`` is ``H(softmax(logits[b, t - 1] / temperature))``, the same
    shift as ``token_logprobs``; a token at position 0 has no prediction and gets 0.0. The
    distributions are taken ``chunk_tokens`` at a time, so the extra memory is
    ``chunk_tokens x V`` floats, not another ``[B, T, V]``.

    Args:
        logits: [B, T, V] float. Model outputs (read, never differentiated).
        mask: [B, T] bool. Tokens whose entropy is wanted.
        temperature: Temperature (> 0) the logits are divided by.
        chunk_tokens: Distributions per chunk (>= 1).

    Returns:
        [N] float32 entropies (nats) of the N masked tokens, in row-major order.

    Raises:
        ValueError: ``logits`` is not 3-D floating point, ``mask`` is not a bool ``[B, T]``,
            ``temperature <= 0`` or ``chunk_tokens < 1``.
    """
    if logits.dim() != 3 or not logits.is_floating_point():
        raise ValueError(f"logits: expected floating-point [B, T, V], got {logits.dtype} {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature: must be > 0, got {temperature}")
    if mask.dtype != torch.bool or mask.shape != logits.shape[:2]:
        raise ValueError(f"mask: expected bool {tuple(logits.shape[:2])}, got {mask.dtype} {tuple(mask.shape)}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens: must be >= 1, got {chunk_tokens}")
    with torch.no_grad():
        rows, cols = mask.nonzero(as_tuple=True)
        out = torch.zeros(rows.numel(), dtype=torch.float32, device=logits.device)
        has_prefix = (cols > 0).nonzero(as_tuple=True)[0]
        for lo in range(0, has_prefix.numel(), chunk_tokens):
            at = has_prefix[lo : lo + chunk_tokens]
            scaled = logits[rows[at], cols[at] - 1].float() / temperature
            log_p = torch.log_softmax(scaled, dim=-1)
            out[at] = -(log_p.exp() * log_p).sum(dim=-1)
        return out


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of the next-token distribution that produced each token, with the same shift.

    ``out[b, t] = H(softmax(logits[b, t - 1] / temperature))`` for ``t >= 1``, ``out[b, 0] = 0.0``,
    so it lines up with ``token_logprobs`` and ``action_mask``.

    Args:
        logits: [B, T, V] float (float32, bf16 or fp16). Model outputs.
        temperature: Temperature (> 0) the logits are divided by.

    Returns:
        [B, T] float32 entropies (nats), differentiable w.r.t. ``logits``.

    Raises:
        ValueError: ``logits`` is not 3-D floating point, or ``temperature <= 0``.
    """
    scaled = _shifted_scaled_logits(logits, temperature)
    batch, length, _ = logits.shape
    log_p = torch.log_softmax(scaled, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1)
    first = torch.zeros((batch, min(length, 1)), dtype=torch.float32, device=logits.device)
    return torch.cat([first, entropy], dim=1)


def predicting_logits(logits: Tensor, mask: Tensor) -> Tensor:
    """The logits that predicted each masked token: row ``n`` is ``logits[b, t - 1]`` for the n-th True ``mask[b, t]``.

    The same shift as ``token_logprobs``, for losses that compare whole next-token distributions
    (``losses.gkd``). Only the masked positions are gathered, so the result is ``[N, V]``, not
    another ``[B, T, V]``. Rows keep the logits' dtype and gradient.

    Args:
        logits: [B, T, V] float. Model outputs for a batch of token sequences.
        mask: [B, T] bool. Tokens whose predicting distribution is wanted (action tokens).

    Returns:
        [N, V] logits, N = ``mask.sum()``, in row-major order of the mask.

    Raises:
        ValueError: ``logits`` is not 3-D floating point, ``mask`` is not a bool ``[B, T]``, or ``mask``
            is True at position 0 (no token predicts the first one).
    """
    if logits.dim() != 3 or not logits.is_floating_point():
        raise ValueError(f"logits: expected floating-point [B, T, V], got {logits.dtype} {tuple(logits.shape)}")
    if mask.dtype != torch.bool or mask.shape != logits.shape[:2]:
        raise ValueError(f"mask: expected bool {tuple(logits.shape[:2])}, got {mask.dtype} {tuple(mask.shape)}")
    if mask.shape[1] and bool(mask[:, 0].any()):
        raise ValueError("mask: True at position 0, which no distribution predicts (the first token is context)")
    rows, cols = mask.nonzero(as_tuple=True)
    return logits[rows, cols - 1]
