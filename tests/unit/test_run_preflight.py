"""``posttrain run`` checks its model directory and its output directory before any work (issue 23, items 10, 11).

The audit saw a 34-line traceback about sentencepiece for an empty ``model.path`` directory, and a
``PermissionError`` traceback for a read-only ``output_dir`` after the model had been prepared.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.cli import main

REPO = Path(__file__).resolve().parents[2]
SFT = ["run", str(REPO / "configs" / "sft_cpu.yaml")]


def test_empty_model_directory_is_one_line_naming_it_and_the_expected_files(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "model"
    empty.mkdir()
    assert main([*SFT, f"model.path={empty}", f"output_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "sentencepiece" not in err
    assert f"model.path: {empty} has no model or tokenizer (missing: config.json, weights, tokenizer)" in err
    assert "expected config.json, weights (model.safetensors" in err and "tokenizer.json or tokenizer_config.json" in err
    assert not (tmp_path / "runs").exists()  # refused before the run directory was made


def test_model_directory_with_config_but_no_tokenizer_names_what_is_missing(tmp_path: Path, capsys) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    (model / "model.safetensors").write_bytes(b"")
    assert main([*SFT, f"model.path={model}", f"output_dir={tmp_path / 'runs'}"]) == 2
    assert "(missing: tokenizer)" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv")
def test_read_only_output_dir_is_one_line_naming_the_path_before_any_work(tmp_path: Path) -> None:
    """Root ignores file modes, so as root the command runs without CAP_DAC_OVERRIDE (as the audit did)."""
    out = tmp_path / "readonly"
    out.mkdir()
    out.chmod(0o555)
    cmd = [sys.executable, "-m", "posttrain.cli", *SFT, f"output_dir={out}", "sft.steps=1"]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps",
               "-dac_override,-dac_read_search", *cmd]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    out.chmod(0o755)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("posttrain:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert f"output_dir: cannot write the run directory {out / 'sft-cpu'}" in lines[0]
    assert "Permission denied" in lines[0]
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("url", ["http://x", "redis://host:notaport"])
def test_malformed_redis_url_in_the_environment_is_one_line_before_any_work(tmp_path: Path, capsys,
                                                                             monkeypatch, url: str) -> None:
    """Audit: ``REDIS_URL=http://x`` failed with a ValueError traceback after 14 s of preparing the model."""
    monkeypatch.setenv("REDIS_URL", url)
    assert main(["run", str(REPO / "configs" / "sao_demo_cpu.yaml"), f"output_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posttrain: config error: REDIS_URL: ") and "\n" not in err
    assert not (tmp_path / "runs").exists()
    assert main(["learner", str(REPO / "configs" / "sao_demo_cpu.yaml")]) == 2
    assert "REDIS_URL: " in capsys.readouterr().err


@pytest.mark.parametrize(("config", "field"), [
    ("sao_demo_cpu.yaml", "data.train_path"),
    ("sao_demo_cpu.yaml", "data.eval_path"),
    ("dpo_cpu.yaml", "dpo.data_path"),
])
def test_a_missing_input_file_is_one_line_naming_the_field_before_any_work(tmp_path: Path, capsys,
                                                                          config: str, field: str) -> None:
    """A new user's check: a missing ``data.train_path`` was refused only after stage 1 (the model prepared), and
    left the run directory with its config and log behind."""
    missing = tmp_path / "nope.jsonl"
    assert main(["run", str(REPO / "configs" / config), f"{field}={missing}", f"output_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert f"{field}: {missing} does not exist" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("make", ["empty", "directory"])
def test_an_empty_task_file_or_a_directory_is_refused_before_any_work(tmp_path: Path, capsys, make: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.mkdir() if make == "directory" else path.write_bytes(b"")
    assert main(["run", str(REPO / "configs" / "sao_demo_cpu.yaml"), f"data.train_path={path}",
                 f"output_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert f"data.train_path: {path} " + ("is empty (no rows)" if make == "empty" else "is not a file") in err
    assert not (tmp_path / "runs").exists()


GOOD_ROW = {
    "rl": {"prompt": "1+1?", "reference": "2"},
    "sft": {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "#### 2"}]},
    "dpo": {"prompt": "1+1?", "chosen": "#### 2", "rejected": "#### 3"},
}
BAD_ROW = {"rl": ({"prompt": "1+1?"}, "reference"), "sft": ({"messages": []}, "messages"),
           "dpo": ({"prompt": "1+1?", "chosen": "#### 2"}, "rejected")}


@pytest.mark.parametrize(("config", "field", "fmt"), [
    ("sao_demo_cpu.yaml", "data.train_path", "rl"),
    ("grpo_cpu.yaml", "data.eval_path", "rl"),
    ("sft_cpu.yaml", "sft.data_path", "sft"),
    ("dpo_cpu.yaml", "dpo.data_path", "dpo"),
    ("gkd_cpu.yaml", "gkd.data_path", "sft"),  # its fixed sequences, read with gkd.lmbda < 1
])
def test_a_malformed_row_anywhere_in_an_input_file_is_refused_before_any_work(
    tmp_path: Path, capsys, config: str, field: str, fmt: str
) -> None:
    """A new user's malformed task row (line 3 of 4) was found only after the model was built, 13-20 s in, and left
    a run directory behind; every technique now reads its input files whole before anything is made."""
    import json

    bad, bad_field = BAD_ROW[fmt]
    rows = [GOOD_ROW[fmt], GOOD_ROW[fmt], bad, GOOD_ROW[fmt]]
    path = tmp_path / f"{fmt}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    extra = ["gkd.lmbda=0.5"] if field == "gkd.data_path" else []
    assert main(["run", str(REPO / "configs" / config), f"{field}={path}", "data.on_bad_row=stop", *extra,
                 f"output_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"posttrain: {path}:3: field '{bad_field}': ")
    assert not (tmp_path / "runs").exists()


def test_a_rerun_with_the_fixed_file_elsewhere_takes_over_a_run_directory_that_did_no_work(tmp_path: Path) -> None:
    """The refused run's directory (its config and log only) refused the re-run: 'holds a run started with another
    config'. A directory whose run prepared anything still refuses another config."""
    from posttrain.config import ConfigError, load_config
    from posttrain.runtime import RunContext

    first = RunContext(load_config(None, [f"output_dir={tmp_path}", f"data.train_path={tmp_path / 'a.jsonl'}"]))
    first.save_resolved_config()
    (first.run_dir / "logs").mkdir()
    second = RunContext(load_config(None, [f"output_dir={tmp_path}", f"data.train_path={tmp_path / 'b.jsonl'}"]))
    second.save_resolved_config()
    assert str(tmp_path / "b.jsonl") in (second.run_dir / "resolved_config.yaml").read_text()
    (second.run_dir / "tokenizer").mkdir()  # trained on b.jsonl's tasks: a resume would reuse it
    with pytest.raises(ConfigError, match="holds a run started with another config"):
        first.save_resolved_config()


def test_a_ctrl_c_outside_the_learner_is_one_line_and_exit_130(tmp_path: Path, capsys, monkeypatch) -> None:
    """A Ctrl-C while a run prepares, warm-starts or evaluates raises KeyboardInterrupt: a traceback before."""
    import posttrain.runners

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(posttrain.runners, "run", interrupted)
    monkeypatch.setenv("MLFLOW_CONFIGURE_LOGGING", "false")  # what the run's log routing would set for good
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        assert main([*SFT, f"output_dir={tmp_path / 'runs'}"]) == 130
    finally:  # the run routed this process's logging to its log file
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(False)
    err = capsys.readouterr().err.strip()
    assert err == "posttrain: interrupted (Ctrl-C); run the same command again to resume"


@pytest.mark.parametrize(("command", "verb"), [("cost", "report"), ("tenant", "render"), ("traces", "import")])
def test_help_of_a_command_with_a_sub_command_names_it_and_exits_0(command: str, verb: str, capsys) -> None:
    """``posttrain cost --help`` (a new user's first try) exits 0 and names the sub-command whose -h lists the
    options, instead of refusing '--help' as a sub-command."""
    assert main([command, "--help"]) == 0
    assert f"posttrain {command} {verb} -h" in capsys.readouterr().out
