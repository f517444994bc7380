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
    lines = [line.split(", ", 1)[1].rsplit(", ", 1)[0] for line in capsys.readouterr().out.splitlines()]
    assert lines == ["stale drops 25%, masked tokens 20%", "stale drops 0%, masked tokens 100%"]
    assert seen == [0, 1, 2, 3, 4]
