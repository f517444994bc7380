"""``posttrain run`` names a generator that dies while the run goes on (issue 32: "generators 2", no line).

Real processes stand in for generators (``python -c 'sleep'``); one is SIGKILLed while watched.
Run: ``python -m pytest -q tests/unit/runners/test_generator_deaths.py``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from posttrain.runners.common import infra_row
from posttrain.runners.generator_deaths import GeneratorDeaths, describe_exit


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_generator_killed_while_the_run_goes_on_is_named_in_a_line_and_in_the_summary(tmp_path: Path) -> None:
    """g0 SIGKILLed while watched: one line names it, its signal, the 1 of 2 left and its log; the summary
    says 2 started, 1 died. g1 stopped after ``stop()`` (the run's own stop) is no death."""
    procs = [_sleeper(), _sleeper()]
    lines: list[str] = []
    deaths = GeneratorDeaths(procs, ["g0", "g1"], tmp_path, poll_s=0.05, out=lines.append).start()
    try:
        assert deaths.summary_value() == "2"
        procs[0].kill()
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        deaths.stop()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    deaths.check()  # g1 ended after stop(): not reported
    assert len(lines) == 1 and "generator g0 died (killed by SIGKILL)" in lines[0]
    assert "the run goes on with 1 of 2 generators" in lines[0] and str(tmp_path / "generator-g0.log") in lines[0]
    assert deaths.died == [("g0", "killed by SIGKILL")]
    assert deaths.summary_value() == "2 started, 1 died: g0 (killed by SIGKILL)"
    assert describe_exit(1) == "exit status 1" and describe_exit(-15) == "killed by SIGTERM"


def test_the_summary_counts_infrastructure_failures_by_cause() -> None:
    assert infra_row({"infra/errors": 0.0}) == "0"
    counters = {"infra/errors": 3.0, "infra/share": 0.1, "infra/reissued": 3.0, "infra/abandoned": 0.0,
                "infra/lost_in_flight": 2.0, "infra/tool_killed": 2.0, "infra/grader_killed": 1.0}
    assert infra_row(counters) == "3 (grader_killed 1, tool_killed 2); 3 re-issued, 0 given up"
