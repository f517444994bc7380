"""Every weight-store read and write with a deadline: a store that blocks (a hung NFS mount) gives one error.

``TimedWeightStore(store, timeout_s)`` has the ``WeightStore`` methods; each call runs on its own
daemon thread and raises ``WeightStoreTimeout`` (a ``TimeoutError`` naming the operation, the store
and ``weights_timeout_s``) when it has not returned within ``timeout_s`` seconds. The blocked thread
is left behind as a daemon: it cannot be interrupted, but it never keeps the process from exiting
(a thread pool's workers would be joined at exit, and the process would hang there instead).
``acall`` does the same from an event loop without blocking it, and gives up early when a stop
event is set, so a generator whose store hangs still honours its stop key and SIGTERM.

Guarantees: a call returns, raises its own error, or raises ``WeightStoreTimeout`` within
``timeout_s``. Not guaranteed: the abandoned call may still complete later (a publish that
finishes after its timeout leaves a complete version behind, which is harmless).

Example: ``TimedWeightStore(FilesystemWeightStore(root), timeout_s=120).latest_version()``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from torch import Tensor

from posttrain.weight_sync.store import WeightStore

T = TypeVar("T")


class WeightStoreTimeout(TimeoutError):
    """A weight-store operation did not finish within ``weights_timeout_s`` (the message is one line)."""


def call_with_timeout(op: str, fn: Callable[[], T], timeout_s: float) -> T:
    """Run ``fn`` on a daemon thread; return its result or raise its error within ``timeout_s`` seconds.

    Raises:
        WeightStoreTimeout: ``fn`` was still running after ``timeout_s`` seconds.
        ValueError: ``timeout_s <= 0``.
        Whatever ``fn`` raised.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: must be > 0 seconds, got {timeout_s}")
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread, never swallowed
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"weight-store {op}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise WeightStoreTimeout(f"weight store: {op} did not finish within {timeout_s:g} s (weights_timeout_s)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


async def acall(op: str, fn: Callable[[], T], timeout_s: float, stopping: asyncio.Event | None = None) -> T | None:
    """``call_with_timeout`` from an event loop: the loop keeps running meanwhile.

    Returns:
        ``fn``'s result, or None when ``stopping`` was set first (the call is abandoned).

    Raises:
        WeightStoreTimeout: ``fn`` was still running after ``timeout_s`` seconds.
        Whatever ``fn`` raised.
    """
    loop = asyncio.get_running_loop()
    result = loop.create_future()

    def done(ok: bool, value: Any) -> None:
        if not result.done():
            (result.set_result if ok else result.set_exception)(value)

    def run() -> None:
        try:
            value = fn()
        except BaseException as exc:  # handed to the loop, never swallowed
            loop.call_soon_threadsafe(done, False, exc)
        else:
            loop.call_soon_threadsafe(done, True, value)

    threading.Thread(target=run, name=f"weight-store {op}", daemon=True).start()
    waiters: set[asyncio.Future[Any]] = {result}
    stop_task = asyncio.ensure_future(stopping.wait()) if stopping is not None else None
    if stop_task is not None:
        waiters.add(stop_task)
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if stop_task is not None:
            stop_task.cancel()
    if result.done():
        return result.result()  # type: ignore[no-any-return]
    if stopping is not None and stopping.is_set():
        return None
    raise WeightStoreTimeout(f"weight store: {op} did not finish within {timeout_s:g} s (weights_timeout_s)")


class TimedWeightStore:
    """A ``WeightStore`` whose every operation has a deadline (module docstring).

    Args:
        inner: The real store (filesystem or S3).
        timeout_s: Longest time (seconds) one operation may take (``weights_timeout_s``).

    Raises:
        ValueError: ``timeout_s <= 0``.
    """

    def __init__(self, inner: WeightStore, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0 seconds, got {timeout_s}")
        self.inner, self.timeout_s = inner, timeout_s

    def __repr__(self) -> str:
        return f"TimedWeightStore({self.inner!r}, timeout_s={self.timeout_s:g})"

    def publish(self, state_dict: Mapping[str, Tensor], policy_version: int, config_dir: Path, *,
                overwrite: bool = False) -> Path:
        """``inner.publish`` within the deadline (raises ``WeightStoreTimeout`` after it)."""
        return call_with_timeout(
            f"publish v{policy_version} to {self.inner!r}",
            lambda: self.inner.publish(state_dict, policy_version, config_dir, overwrite=overwrite), self.timeout_s)

    def latest_version(self) -> int | None:
        """``inner.latest_version`` within the deadline (raises ``WeightStoreTimeout`` after it)."""
        return call_with_timeout(f"read LATEST of {self.inner!r}", self.inner.latest_version, self.timeout_s)

    def path_for(self, policy_version: int) -> Path:
        """``inner.path_for`` within the deadline (raises ``WeightStoreTimeout`` after it)."""
        return call_with_timeout(f"find v{policy_version} in {self.inner!r}",
                                 lambda: self.inner.path_for(policy_version), self.timeout_s)

    def prune(self, keep: int = 3) -> list[int]:
        """``inner.prune`` within the deadline (raises ``WeightStoreTimeout`` after it)."""
        return call_with_timeout(f"prune {self.inner!r}", lambda: self.inner.prune(keep), self.timeout_s)

    def __getattr__(self, name: str) -> Any:
        # Store-specific extras (``versions``, ``load_state_dict``, ``root``) go to the inner store.
        return getattr(self.inner, name)
