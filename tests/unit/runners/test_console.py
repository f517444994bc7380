"""``posttrain.runners.console``: library records and engine output go to the run log, the run's own lines stay on the console."""

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from posttrain.runners.console import RUN_LOG, ConsoleFilter, engine_output_to_log, route_logs


def _record(name: str, level: int) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "message", None, None)


@pytest.mark.parametrize(("name", "level", "shown"), [
    ("posttrain.runners.sao", logging.WARNING, True),
    ("posttrain", logging.ERROR, True),
    ("posttrain.learner", logging.INFO, False),
    ("mlflow.store.db.utils", logging.INFO, False),
    ("vllm.engine", logging.WARNING, False),
    ("py.warnings", logging.WARNING, False),
    ("transformers.modeling_utils", logging.ERROR, True),
    ("posttrainer", logging.WARNING, False),  # another package whose name only starts alike
])
def test_the_console_shows_posttrain_warnings_and_every_error_only(name, level, shown):
    assert ConsoleFilter().filter(_record(name, level)) is shown


@pytest.fixture
def _restored_logging(monkeypatch):
    """Give the root logger back its handlers, level and warnings capture after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    monkeypatch.delenv("MLFLOW_CONFIGURE_LOGGING", raising=False)
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


def test_library_records_and_python_warnings_go_to_the_run_log_and_posttrain_warnings_to_both(
        tmp_path: Path, capsys, _restored_logging) -> None:
    import os

    path = route_logs(tmp_path / "run")
    assert path == tmp_path / "run" / RUN_LOG
    assert not (tmp_path / "run").exists()  # made at the first record: a run refused before any work leaves none
    assert (os.environ["MLFLOW_CONFIGURE_LOGGING"], os.environ["VLLM_CONFIGURE_LOGGING"]) == ("false", "0")
    logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
    logging.getLogger("vllm.engine").warning("chunked prefill is not officially supported")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a torch user warning", UserWarning, stacklevel=1)
    logging.getLogger("posttrain.runners.sao").warning("stop key not set")
    logging.getLogger("posttrain.learner").info("a learner info line")
    err = capsys.readouterr().err
    assert err.splitlines() == ["posttrain: WARNING posttrain.runners.sao: stop key not set"]
    log = path.read_text(encoding="utf-8")
    for text in ("mlflow.store.db.utils INFO Creating initial MLflow database tables...",
                 "vllm.engine WARNING chunked prefill is not officially supported", "a torch user warning",
                 "posttrain.runners.sao WARNING stop key not set", "posttrain.learner INFO a learner info line"):
        assert text in log, (text, log)


def test_child_process_output_inside_engine_output_to_log_lands_in_the_file_and_the_console_comes_back(
        tmp_path: Path, capfd) -> None:
    """A child started inside (as vLLM's EngineCore is) writes to the log; the parent's console is restored after."""
    path = tmp_path / "logs" / "run.log"
    print("before", flush=True)
    with engine_output_to_log(path):
        subprocess.run([sys.executable, "-c", "import sys; print('child out'); sys.stderr.write('child warning\\n')"],
                       check=True)
    print("after", flush=True)
    out, err = capfd.readouterr()
    assert out.splitlines() == ["before", "after"]
    assert err == ""
    assert path.read_text(encoding="utf-8").splitlines() == ["child out", "child warning"]


def test_an_error_inside_engine_output_to_log_propagates_with_the_console_restored(tmp_path: Path, capfd) -> None:
    with pytest.raises(RuntimeError, match="engine died"), engine_output_to_log(tmp_path / "run.log"):
        raise RuntimeError("engine died")
    print("visible", flush=True)
    assert capfd.readouterr().out == "visible\n"


def test_verbose_puts_every_record_on_the_console_too(tmp_path: Path, capsys, _restored_logging) -> None:
    path = route_logs(tmp_path / "run", verbose=True)
    logging.getLogger("mlflow.store.db.utils").debug("a debug line")
    assert capsys.readouterr().err.splitlines() == ["posttrain: DEBUG mlflow.store.db.utils: a debug line"]
    assert "mlflow.store.db.utils DEBUG a debug line" in path.read_text(encoding="utf-8")


def test_a_library_imported_before_the_routing_loses_its_own_console_handler(
        tmp_path: Path, capsys, _restored_logging) -> None:
    """MLflow imported earlier (a component, an earlier test) has put its own stderr handler on ``mlflow`` and stopped
    propagation: the full suite printed ``INFO mlflow.store.db.utils`` on the console while this file alone passed.
    After ``route_logs`` the record goes to the run log only, and the library's logger propagates again."""
    import sys

    own = logging.getLogger("mlflow")
    before = (list(own.handlers), own.propagate, own.level)
    handler = logging.StreamHandler(sys.stderr)
    own.addHandler(handler)
    own.propagate, own.level = False, logging.INFO
    try:
        path = route_logs(tmp_path / "run")
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
        assert capsys.readouterr().err == ""
        assert "Creating initial MLflow database tables" in path.read_text(encoding="utf-8")
        assert own.propagate and handler not in own.handlers
    finally:
        for h in list(own.handlers):
            own.removeHandler(h)
        for h in before[0]:
            own.addHandler(h)
        own.propagate, own.level = before[1], before[2]


def test_warnings_are_captured_again_after_an_earlier_capture_was_undone(tmp_path: Path, _restored_logging) -> None:
    """An earlier run in the same process turned the capture on, and a ``warnings.catch_warnings`` block around it
    (pytest's, per test) put the original ``showwarning`` back without telling ``logging``: CI's full suite then lost
    the warning from the run log while this file alone passed. ``route_logs`` must install the capture anew."""
    original = warnings.showwarning
    with warnings.catch_warnings():
        logging.captureWarnings(True)  # the earlier run's routing, undone at the block's end
    assert warnings.showwarning is original
    path = route_logs(tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a warning after the undone capture", UserWarning, stacklevel=1)
    assert "a warning after the undone capture" in path.read_text(encoding="utf-8")


def test_the_progress_line_shows_the_shares_that_stop_a_learner_without_progress(capsys) -> None:
    """Every 2 versions: the mean reward and the mean shares of the batches since the last line (the first line also
    counts a warm-up batch, which has no shares yet); the uniform-group share only where there are groups."""
    from posttrain.runners.sao import progress_sink

    seen: list[int] = []
    tee = progress_sink(lambda metrics, step: seen.append(step), total=4, every=2)
    tee({"reward/mean": 0.5}, 0)
    for version, stale, masked in ((1, 0.0, 0.1), (2, 0.5, 0.3), (3, 0.0, 1.0), (4, 0.0, 1.0)):
        tee({"reward/mean": 0.25, "progress/stale_dropped_frac": stale, "progress/masked_tokens_frac": masked}, version)
    lines = [line.split(", ", 1)[1].rsplit("  (at ", 1)[0] for line in capsys.readouterr().out.splitlines()]
    assert lines == ["stale drops 25%, masked tokens 20%", "stale drops 0%, masked tokens 100%"]
    assert seen == [0, 1, 2, 3, 4]


def test_the_console_clock_counts_from_the_process_start_not_from_the_first_import() -> None:
    """The summary's wall time missed the start-up (12 s shown against 32 s real): the interpreter, the imports and
    MLflow's set-up. A process that waits 1.5 s before importing the clock reads at least 1.5 s."""
    code = ("import time; time.sleep(1.5); from posttrain.runners.console import seconds_since_start; "
            "print(seconds_since_start())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert float(out.stdout) >= 1.5


def test_stage_and_progress_lines_read_one_labelled_clock_and_say_batch_in_the_singular(capsys) -> None:
    """Two unlabelled clocks were on the console (the stage's ``at N s`` since the runner began, the progress
    line's bare ``N s`` since SAO began), and a progress line read "mean of the 1 batches"."""
    from posttrain.runners.sao import StageClock, progress_sink

    now = iter([20.0, 30.0, 41.0, 55.0, 60.0]).__next__
    clock = StageClock(5, clock=now)
    clock.begin("prepare", "prepare")  # 20 s after the process started: the start-up stage
    clock.begin("SAO", "SAO")
    sink = progress_sink(lambda metrics, step: None, total=4, every=2, clock=now)
    sink({"reward/mean": 0.5}, 1)
    sink({"reward/mean": 0.25}, 2)
    sink({"reward/mean": 1.0}, 4)
    assert capsys.readouterr().out.splitlines() == [
        "[1/5] prepare  (at 20 s)",
        "[2/5] SAO  (at 30 s)",
        "      policy version 2/4: training reward 0.38 (mean of 2 batches since the last line)  (at 41 s)",
        "      policy version 4/4: training reward 1.00 (mean of 1 batch since the last line)  (at 55 s)",
    ]
    clock.end()
    assert clock.row() == "start-up 20, prepare 10, SAO 30"
    resumed = progress_sink(lambda metrics, step: None, total=60, every=10, clock=lambda: 99.0)
    for step in (11, 12, 20):  # resumed at version 10: no line at 11 for "1 batch"
        resumed({"reward/mean": 0.5}, step)
    assert capsys.readouterr().out.splitlines() == [
        "      policy version 20/60: training reward 0.50 (mean of 3 batches since the last line)  (at 99 s)"]


def test_posttrain_eval_keeps_its_result_on_the_console_and_engine_output_in_a_log(tiny_model, tmp_path: Path) -> None:
    """``posttrain eval`` printed vLLM's ~70-line start-up report and tqdm bars on the console; ``posttrain run``
    already sent them to its run log. Now the console has the log's path and the result line only (a process of
    its own: the engine's output reaches file descriptors 1 and 2, which pytest's capture does not stand for)."""
    import os

    out = tmp_path / "eval"
    env = {k: v for k, v in os.environ.items()  # transformers' loading bar on: something for the log to catch
           if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "TQDM_DISABLE")}
    done = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "eval", "--benchmark", "gsm8k", "--model", str(tiny_model.path),
         "--limit", "2", "--engine", "hf", "--max-new-tokens", "8", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False, env=env)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 0, lines[-20:]
    assert lines[0] == f"posttrain eval: library and engine messages go to {out / RUN_LOG}"
    assert len(lines) == 2 and lines[1].startswith("gsm8k: avg@1 = "), lines
    assert "Loading weights" in (out / RUN_LOG).read_text(encoding="utf-8")  # transformers' tqdm bar, in the log
