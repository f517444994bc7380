"""``posttrain.cli.run_with_one_line_errors``: the project's one-line errors end ``posttrain`` and ``bench/*.py`` alike.

Run: ``python -m pytest -q tests/unit/test_cli_errors.py``.
"""

import os
import signal

import pytest

from posttrain.cli import run_with_one_line_errors
from posttrain.config import ConfigError
from posttrain.learner.liveness import LearnerStopped
from posttrain.rollout.queue import RedisUnreachableError


@pytest.mark.parametrize(("error", "line", "status"), [
    (LearnerStopped("learner stopped at policy version 10 of 12: SIGTERM received", 143),
     "bench.x: learner stopped at policy version 10 of 12: SIGTERM received", 143),
    (LearnerStopped("learner stopped at policy version 3 of 12: no progress for 20 learner iterations", 1),
     "bench.x: learner stopped at policy version 3 of 12: no progress for 20 learner iterations", 1),
    (ConfigError("sao.steps: Input should be greater than or equal to 1"),
     "bench.x: config error: sao.steps: Input should be greater than or equal to 1", 2),
    (RedisUnreachableError("Redis at redis://127.0.0.1:1 unreachable (retried for 0 s)"),
     "bench.x: Redis at redis://127.0.0.1:1 unreachable (retried for 0 s)", 1),
])
def test_a_known_error_ends_the_command_with_one_line_and_its_status(capsys, error, line, status):
    def command() -> int:
        raise error

    assert run_with_one_line_errors("bench.x", command) == status
    out = capsys.readouterr()
    assert out.err.splitlines() == [line] and out.out == ""


def test_any_other_error_keeps_its_traceback_and_sigterm_ends_with_one_line_then_the_handler_is_put_back(capsys):
    def bug() -> int:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run_with_one_line_errors("bench.x", bug)
    before = signal.getsignal(signal.SIGTERM)

    def terminated() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        return 0

    assert run_with_one_line_errors("bench.x", terminated, sigterm=True) == 143
    assert capsys.readouterr().err.splitlines() == ["bench.x: SIGTERM received; stopped"]
    assert signal.getsignal(signal.SIGTERM) is before
