"""Configs that passed ``validate-config`` and then failed inside ``posttrain run`` (issue 23, items 13 and 16).

Each case was reproduced by the fault-injection audit: it validated (rc 0) and then gave a
traceback, a pydantic-core panic or a hang at run time, or trimmed unacknowledged stream entries.
Now ``posttrain validate-config`` exits 2 with one line naming the field and the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import ConfigError, load_config
from posttrain.config.environments import ENVIRONMENT_ARGUMENT_KINDS
from posttrain.config.load import MAX_CONFIG_DEPTH

BOMB = """\
data:
  env: synthetic_arith
  env_args:
    low: &a [x, x, x, x, x, x, x, x, x]
    high: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
    operators: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
    heldout_fraction: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
    unmarked_fraction: [*d, *d, *d, *d, *d, *d, *d, *d, *d]
"""


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_yaml_bomb_inside_env_args_is_refused_at_validation(tmp_path: Path, capsys) -> None:
    f = tmp_path / "bomb.yaml"
    f.write_text(BOMB, encoding="utf-8")
    err = _one_line_error(capsys, ["validate-config", str(f)])
    assert "data.env_args: more than 10000 values" in err


def test_env_args_of_the_wrong_type_name_the_key_and_the_type() -> None:
    with pytest.raises(ConfigError, match=r"data.env_args.low: expected an integer for data.env='synthetic_arith', "
                                          r"got 'abc'"):
        load_config(None, ["data.env_args.low=abc"])
    with pytest.raises(ConfigError, match="data.env_args.operators: expected a list of strings"):
        load_config(None, ["data.env_args.operators=[1, 2]"])
    assert load_config(None, ["data.env_args.heldout_fraction=0", "data.env_args.operators=['+']"])


def test_every_plain_env_argument_kind_matches_the_constructor_annotation() -> None:
    """The config layer's table of argument kinds must not drift from the constructors it stands for."""
    import typing
    from collections.abc import Sequence

    from posttrain.envs.registry import ENVIRONMENT_CLASSES

    expected = {"int": int, "float": float, "str": str, "str?": str | None, "list[str]": Sequence[str]}
    for env, kinds in ENVIRONMENT_ARGUMENT_KINDS.items():
        hints = typing.get_type_hints(ENVIRONMENT_CLASSES[env]().__init__)
        plain = {k for k, v in hints.items() if v in expected.values()}
        assert set(kinds) == plain, env
        for key, kind in kinds.items():
            assert hints[key] == expected[kind], (env, key)


@pytest.mark.parametrize("url", ["http://x", "redis://", "redis://host:notaport", "redis://host:99999",
                                 "redis://host/db0", "unix://", "localhost:6379"])
def test_malformed_redis_url_is_refused_at_validation(url: str, capsys) -> None:
    err = _one_line_error(capsys, ["validate-config", "configs/sao_demo_cpu.yaml", f"queue.redis_url={url}"])
    assert "queue.redis_url" in err


def test_well_formed_redis_urls_pass() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://user:pw@redis.team-a:6380", "unix:///run/redis.sock"):
        assert load_config(None, [f"queue.redis_url={url}"]).queue.redis_url == url


def test_output_dir_that_is_a_file_is_refused_at_validation(tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0\n", encoding="utf-8")
    err = _one_line_error(capsys, ["validate-config", "configs/sao_demo_cpu.yaml", f"output_dir={a_file}"])
    assert "output_dir" in err and "is a file, not a directory" in err
    err = _one_line_error(capsys, ["validate-config", "configs/sao_demo_cpu.yaml", f"output_dir={a_file}/runs"])
    assert f"lies under {a_file}, which is a file" in err


def test_deeply_nested_yaml_is_one_line_not_a_recursion_error(tmp_path: Path, capsys) -> None:
    f = tmp_path / "deep.yaml"
    f.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    err = _one_line_error(capsys, ["validate-config", str(f)])
    assert "nested" in err and str(f) in err
    shallow_but_over = tmp_path / "over.yaml"
    shallow_but_over.write_text("data:\n  env_args:\n    low: " + "[" * 70 + "]" * 70 + "\n", encoding="utf-8")
    err = _one_line_error(capsys, ["validate-config", str(shallow_but_over)])
    assert f"nested deeper than {MAX_CONFIG_DEPTH} levels" in err


def test_deeply_nested_override_is_one_line(capsys) -> None:
    err = _one_line_error(capsys, ["validate-config", "configs/sao_demo_cpu.yaml", "x=" + "[" * 50_000 + "]" * 50_000])
    assert "nested" in err
    err = _one_line_error(capsys, ["validate-config", "configs/sao_demo_cpu.yaml", "a." * 50_000 + "b=1"])
    assert "nested deeper" in err


def test_maxlen_that_cannot_hold_the_unacknowledged_window_is_refused_with_the_bound() -> None:
    """The audit's run: maxlen 10, B=4, checkpoint_every=5, tau=2 -> needs (5 + 2 + 2) x 4 = 36 entries."""
    base = ["technique=sao", "sao.batch_size=4", "sao.micro_batch_size=4", "sao.checkpoint_every=5",
            "sao.max_staleness=2"]
    with pytest.raises(ConfigError, match=r"queue.maxlen \(10\) must be >= .* = \(5 \+ 2 \+ 2\) x 4 = 36 entries"):
        load_config(None, [*base, "queue.maxlen=10"])
    assert load_config(None, [*base, "queue.maxlen=36"]).queue.maxlen == 36
    with pytest.raises(ConfigError, match=r"grpo.prompts_per_step x grpo.group_size"):
        load_config(None, ["technique=grpo", "grpo.async=true", "grpo.prompts_per_step=8", "grpo.group_size=4",
                           "grpo.checkpoint_every=2", "grpo.loss.dis_mask=true", "queue.maxlen=100"])


def test_a_no_generator_wait_shorter_than_the_heartbeat_ttl_is_refused() -> None:
    """Issue 23 (item 1's settings): the learner must wait longer than one heartbeat TTL before it
    calls every generator dead, or it stops beside generators that are alive."""
    with pytest.raises(ConfigError, match=r"learner.no_generator_timeout_s \(20.0\) must be greater than "
                                          r"generator.heartbeat_ttl_s \(30.0\)"):
        load_config(None, ["learner.no_generator_timeout_s=20", "generator.heartbeat_ttl_s=30"])
    cfg = load_config(None, ["learner.no_generator_timeout_s=31", "generator.heartbeat_ttl_s=30"])
    assert cfg.learner.no_generator_timeout_s > cfg.generator.heartbeat_ttl_s


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_an_empty_config_file_is_refused_in_one_line(tmp_path: Path, capsys, text: str) -> None:
    """A new user's empty YAML validated, ran a full default SAO run and registered its model."""
    f = tmp_path / "empty.yaml"
    f.write_text(text, encoding="utf-8")
    err = _one_line_error(capsys, ["validate-config", str(f)])
    assert err == (f"posttrain: config error: {f}: empty config file (no settings); a config names at least its "
                   "technique, e.g. `technique: sft` (examples in configs/)")


@pytest.mark.parametrize(("override", "wanted"), [
    ("sao.steps=true", "an integer"), ("seed=false", "an integer"), ("sao.optim.lr=true", "a number"),
    ("sft.max_examples=true", "an integer"), ("learner.resources.gpus=true", "an integer"),
])
def test_a_true_or_false_for_a_number_is_refused(capsys, override: str, wanted: str) -> None:
    """pydantic's lax mode read ``sao.steps=true`` as 1 (a one-version run)."""
    field = override.partition("=")[0]
    err = _one_line_error(capsys, ["validate-config", "configs/sao_demo_cpu.yaml", override])
    assert f"override {override!r}: {field}: expected {wanted}, not true/false" in err


def test_overrides_after_config_option_are_applied_not_dropped(capsys) -> None:
    """With ``--config FILE`` the first override landed in the positional config slot and was dropped in silence
    (``validate-config --config FILE sao.steps=0`` said ok)."""
    err = _one_line_error(capsys, ["validate-config", "--config", "configs/sao_demo_cpu.yaml", "sao.steps=0"])
    assert "override 'sao.steps=0': sao.steps: Input should be greater than or equal to 1" in err


def test_booleans_still_set_boolean_fields() -> None:
    cfg = load_config(None, ["generator.abort_stale_episodes=false", "tracking.register_final=false"])
    assert cfg.generator.abort_stale_episodes is False and cfg.tracking.register_final is False


def test_a_turn_longer_than_the_whole_episode_is_refused_naming_both_fields() -> None:
    """``max_new_tokens`` above ``max_episode_tokens`` was accepted and never applied (each turn is cut to what the
    episode has left)."""
    with pytest.raises(ConfigError, match=r"generator.max_new_tokens \(48\) must be <= generator.max_episode_tokens "
                                          r"\(32\)"):
        load_config(None, ["generator.max_episode_tokens=32", "generator.max_new_tokens=48"])
    assert load_config(None, ["generator.max_episode_tokens=48", "generator.max_new_tokens=48"])


def test_validate_config_refuses_a_missing_or_malformed_input_file_with_the_same_line_as_run(tmp_path: Path,
                                                                                             capsys) -> None:
    """validate-config said ok for a data.train_path that did not exist or had a malformed JSON line, and posttrain
    run then refused it; both now run the same input-file check and print the same one line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1?", "reference": "2"}\n{not json\n', encoding="utf-8")
    for path, expected in ((tmp_path / "missing.jsonl", "data.train_path: "), (bad, f"{bad}:2")):
        argv = ["configs/sao_demo_cpu.yaml", f"data.train_path={path}", "data.on_bad_row=stop",
                f"output_dir={tmp_path / 'runs'}"]
        validate = _one_line_error(capsys, ["validate-config", *argv])
        run = _one_line_error(capsys, ["run", *argv])
        assert expected in validate and validate == run, (validate, run)
    assert not (tmp_path / "runs").exists()
