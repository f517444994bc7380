"""Every weight-store access has a deadline: a LATEST that blocks (a FIFO nobody writes, as a hung NFS read does)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from posttrain.weight_sync.store import FilesystemWeightStore
from posttrain.weight_sync.timed import TimedWeightStore, WeightStoreTimeout, acall


def _blocking_store(tmp_path: Path) -> TimedWeightStore:
    inner = FilesystemWeightStore(tmp_path / "weights")
    os.mkfifo(inner.root / "LATEST")  # open() for reading blocks until a writer comes: none will
    return TimedWeightStore(inner, timeout_s=0.5)


def test_a_blocked_latest_read_raises_a_timeout_naming_the_operation(tmp_path: Path) -> None:
    store = _blocking_store(tmp_path)
    with pytest.raises(WeightStoreTimeout, match=r"read LATEST of .* did not finish within 0.5 s \(weights_timeout_s\)"):
        store.latest_version()
    # The abandoned read is a daemon thread: it cannot keep the process from exiting.
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("weight-store"))


def test_an_async_read_gives_up_when_stopping_is_set(tmp_path: Path) -> None:
    """A generator's watcher on a hung store: stopping (stop key, SIGTERM) ends the wait with None, no error."""
    store = _blocking_store(tmp_path)

    async def main() -> object:
        stopping = asyncio.Event()
        asyncio.get_running_loop().call_later(0.1, stopping.set)
        return await acall("read LATEST", store.inner.latest_version, 60.0, stopping)

    assert asyncio.run(main()) is None


def test_errors_of_the_store_pass_through_unchanged(tmp_path: Path) -> None:
    store = TimedWeightStore(FilesystemWeightStore(tmp_path / "weights"), timeout_s=5.0)
    assert store.latest_version() is None
    with pytest.raises(FileNotFoundError):
        store.inner.load_state_dict(3)
