"""A weight store the generator cannot read: one line and exit 1 (was a PermissionError traceback).

The test runs as root, so the generator is started without ``CAP_DAC_OVERRIDE`` and
``CAP_DAC_READ_SEARCH`` (``setpriv``), as the audit did: ``LATEST`` with mode 000 is then unreadable.
The learner notices through the generator's lapsed heartbeat (``test_role_processes``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from integration.test_sao_fault_tolerance import _ctx
from posttrain.models.hf import load_policy
from posttrain.rollout.liveness import live_generators
from posttrain.rollout.redis_streams import connect
from posttrain.services.embedded_redis import EmbeddedRedis
from posttrain.weight_sync import open_weight_store

pytestmark = [pytest.mark.integration]

NO_DAC = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs setpriv and root")
def test_an_unreadable_latest_gives_one_line_and_the_heartbeat_lapses(tmp_path):
    ctx = _ctx(tmp_path, "unreadable-store", 4, "generator.heartbeat_ttl_s=1")
    open_weight_store(ctx).publish(load_policy(ctx.sft_model_dir).state_dict(), 0, ctx.sft_model_dir)
    latest = ctx.weights_dir / "LATEST"
    latest.chmod(0)
    with EmbeddedRedis() as server:
        proc = subprocess.run(
            [*NO_DAC, sys.executable, "-m", "posttrain.cli", "generator", str(ctx.run_dir / "resolved_config.yaml"),
             "--generator-index", "0"],
            env={**os.environ, "REDIS_URL": server.url}, capture_output=True, text=True, timeout=180,
        )
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        assert lines[-1].startswith("posttrain: ") and "Permission denied" in lines[-1] and str(latest) in lines[-1]
        assert live_generators(connect(server.url), ctx.keys) == []  # gone at once (farewell), or within the TTL
