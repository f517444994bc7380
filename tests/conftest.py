"""Shared pytest fixtures; model fixtures live in ``tests/fixtures_models.py``.

Tests run with one torch intra-op thread: the suite starts generator, learner and vLLM processes
on 2-core machines, where oversubscribed threads made single steps 10-100x slower.
"""

import os

import torch

from fixtures_models import tiny_model

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

__all__ = ["tiny_model"]
