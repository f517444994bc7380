"""Fixtures shared by the learner unit tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Single-threaded torch: on a shared 2-core machine two contending threads are ~100x slower here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
