from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import ConfigError, PodResources, RunConfig, load_config, parse_overrides

CONFIGS = sorted(Path(__file__).resolve().parents[3].joinpath("configs").glob("*.yaml"))


def test_there_are_configs_to_check():
    assert len(CONFIGS) >= 2


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    assert isinstance(load_config(path), RunConfig)


def test_overrides_are_dotted_and_parsed_as_yaml():
    assert parse_overrides(["sao.steps=10", "generator.engine=hf", "sao.loss.mask_eps_low=0.2"]) == {
        "sao": {"steps": 10, "loss": {"mask_eps_low": 0.2}},
        "generator": {"engine": "hf"},
    }
    cfg = load_config(None, ["sao.steps=3", "run_name=x"])
    assert cfg.sao.steps == 3 and cfg.run_name == "x"


def test_out_of_range_value_names_field_and_bound(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("sao:\n  loss:\n    mask_eps_low: 1.5\n")
    with pytest.raises(ConfigError, match=r"sao\.loss\.mask_eps_low: Input should be less than or equal to 1"):
        load_config(p)


def test_unknown_literal_lists_allowed_values():
    with pytest.raises(ConfigError, match=r"generator\.engine: allowed values are 'auto', 'vllm' or 'hf', got 'trt'"):
        load_config(None, ["generator.engine=trt"])


def test_unknown_key_is_an_error_not_ignored():
    with pytest.raises(ConfigError, match=r"sao\.stepz: unknown field"):
        load_config(None, ["sao.stepz=3"])


def test_a_misspelt_key_names_the_closest_valid_key_of_its_section(tmp_path):
    """A new user's typo'd key was refused without a hint. The closest key of the same section is named (override
    or file, alias or name); a key like nothing in its section gets no guess."""
    cases = {"sao.stepz=3": "sao.stepz: unknown field (did you mean sao.steps?)",
             "sao.optim.lrr=1e-4": "sao.optim.lrr: unknown field (did you mean sao.optim.lr?)",
             "grpo.asynk=true": "grpo.asynk: unknown field (did you mean grpo.async?)",
             "sao.lr=1e-4": "sao.lr: unknown field (did you mean sao.optim.lr?)",
             "genrator.engine=hf": "genrator: unknown field (did you mean generator?)",
             "learner.lr=1e-4": "learner.lr: unknown field"}
    for override, expected in cases.items():
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert str(err.value) == f"override {override!r}: {expected}"
    path = tmp_path / "c.yaml"
    path.write_text("technique: sao\nsao:\n  critic:\n    warmup_stepz: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: sao.critic.warmup_stepz: unknown field (did you mean sao.critic.warmup_steps?)"


def test_every_misspelt_field_is_named_in_the_one_line(tmp_path):
    """A new user's check: two misspelt fields gave ``saoo: unknown field (and 1 more)``, naming the first only."""
    path = tmp_path / "two.yaml"
    path.write_text("technique: sao\nsaoo: {}\nleraner: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["sao.stepz=3"])
    message = str(err.value)
    assert "\n" not in message
    for field in ("saoo: unknown field", "leraner: unknown field", "sao.stepz: unknown field"):
        assert field in message, message


def test_each_error_is_filed_under_the_override_that_set_it_whatever_their_order():
    """A new user's check: with two bad overrides both errors came under the first override's label."""
    for order in (["sao.steps=0", "generator.temperature=abc"], ["generator.temperature=abc", "sao.steps=0"]):
        with pytest.raises(ConfigError) as err:
            load_config(None, order)
        message = str(err.value)
        assert "override 'sao.steps=0': sao.steps: " in message, message
        assert "override 'generator.temperature=abc': generator.temperature: " in message, message


def test_an_unknown_section_set_by_an_override_names_the_override_not_the_file(tmp_path):
    """A new user's check: ``sao.critc.lr=1e-3`` was reported as ``CONFIG.yaml: sao.critc: unknown field``, blaming
    the file for the command line's typo; a typo in the file still names the file."""
    path = tmp_path / "c.yaml"
    path.write_text("technique: sao\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["sao.critc.lr=1e-3"])
    assert str(err.value) == "override 'sao.critc.lr=1e-3': sao.critc: unknown field (did you mean sao.critic?)"
    path.write_text("technique: sao\nsao:\n  critc:\n    lr: 1.0e-3\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["sao.critic.lr=1e-3"])
    assert str(err.value) == f"{path}: sao.critc: unknown field (did you mean sao.critic?)"


def test_file_and_override_errors_each_name_their_source(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("technique: sao\nsaoo: {}\nleraner: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["sao.steps=0"])
    message = str(err.value)
    assert message.count(f"{path}: ") == 1 and "override 'sao.steps=0': sao.steps: " in message, message


def test_a_flood_of_errors_names_the_first_few_and_counts_the_rest():
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"sao.typo{i}=1" for i in range(9)])
    message = str(err.value)
    assert all(f"sao.typo{i}: unknown field" in message for i in range(5))
    assert "sao.typo5" not in message and message.endswith("(and 4 more)")


def test_sao_requires_full_softmax_sampling_and_names_both_fields():
    with pytest.raises(ConfigError, match=r"generator\.temperature and generator\.top_p"):
        load_config(None, ["generator.top_p=0.9"])


def test_head_dim_below_32_is_rejected_for_vllm():
    with pytest.raises(ConfigError, match=r"head_dim"):
        load_config(None, ["model.tiny.hidden_size=64", "model.tiny.num_heads=4"])


def test_malformed_override_and_missing_file():
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        parse_overrides(["sao.steps"])
    with pytest.raises(ConfigError, match="no such config file"):
        load_config("/nonexistent/x.yaml")


def test_a_directory_or_broken_yaml_is_a_one_line_config_error(tmp_path, capsys):
    """A directory given as the config, and YAML that does not parse: one line naming the file (and the line)."""
    with pytest.raises(ConfigError, match="not a file"):
        load_config(tmp_path)
    broken = tmp_path / "broken.yaml"
    broken.write_text("sao: {steps: 3\nmodel: x\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not valid YAML \(line \d+, column \d+\): ") as info:
        load_config(broken)
    assert "\n" not in str(info.value)
    assert main(["validate-config", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a file" in err[0]


def test_validate_config_cli_prints_one_line_error_and_exits_2(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("sao: {batch_size: 0}\n")
    assert main(["validate-config", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sao.batch_size" in err[0] and "greater than or equal to 1" in err[0]
    assert main(["validate-config", str(CONFIGS[0])]) == 0


def test_env_args_not_taken_by_the_environment_fail_at_validation_naming_key_and_accepted_args(tmp_path):
    """synthetic_arith's low/high under data.env=gsm8k used to pass validation and raise a TypeError
    in the environment constructor at run time; now load_config rejects them and names them."""
    p = tmp_path / "c.yaml"
    p.write_text("data:\n  env: gsm8k\n  env_args: {low: 0, high: 20}\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    msg = str(err.value)
    assert "\n" not in msg
    assert "data.env_args.low" in msg and "also unknown: high" in msg
    assert "gsm8k accepts: system_prompt, verify_timeout_s" in msg


def test_env_args_check_follows_an_env_override():
    """low/high are fine for synthetic_arith; calls_median (a synthetic_longtail argument) is not
    one of synthetic_tool's."""
    cfg = load_config(None, ["data.env_args={low: 0, high: 20}"])
    assert cfg.data.env == "synthetic_arith" and cfg.data.env_args == {"low": 0, "high": 20}
    with pytest.raises(ConfigError, match=r"data\.env_args\.calls_median for data\.env='synthetic_tool'"):
        load_config(None, ["data.env=synthetic_tool", "data.env_args={low: 0, calls_median: 2.0}"])


def test_synthetic_longtail_is_a_config_environment_and_takes_its_own_args():
    cfg = load_config(None, ["data.env=synthetic_longtail", "data.env_args={calls_median: 2.0, max_calls: 6}"])
    assert cfg.data.env == "synthetic_longtail"


def test_validate_config_cli_rejects_env_args_of_another_env_with_exit_2(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text("data:\n  env: gsm8k\n  env_args: {low: 0}\n")
    assert main(["validate-config", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "data.env_args.low" in err and "gsm8k accepts: system_prompt, verify_timeout_s" in err


def test_a_bad_override_is_blamed_on_the_override_not_the_file(tmp_path):
    """The file is valid; ``sao.batch_size=0`` from the command line is what the error names."""
    path = tmp_path / "ok.yaml"
    path.write_text("technique: sao\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["sao.batch_size=0"])
    assert str(err.value).startswith("override 'sao.batch_size=0': sao.batch_size: ")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["seed=1", "checkpoints_uri=/tmp/x"])
    # Our validators' sentence, without pydantic's "Value error, " label.
    assert str(err.value) == ("override 'checkpoints_uri=/tmp/x': checkpoints_uri: checkpoints_uri must be an "
                              "s3://bucket/prefix URI (or unset), got '/tmp/x'")


def test_run_with_a_missing_training_file_prints_one_line_and_exits_2(tmp_path, capsys):
    """The technique's data path is checked before anything is prepared: one line, no traceback."""
    missing = tmp_path / "nope.jsonl"
    sft = next(p for p in CONFIGS if p.name == "sft_cpu.yaml")
    code = main(["run", str(sft), f"sft.data_path={missing}", f"output_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"posttrain: config error: sft.data_path: {missing} does not exist"]
    assert not (tmp_path / "runs").exists()


def test_learner_and_generator_resources_default_to_one_8_gpu_learner_pod_and_1_gpu_generators():
    cfg = load_config(None)
    assert cfg.learner.nodes == 1
    assert cfg.learner.resources == PodResources(cpu="32", memory="256Gi", gpus=6, shm="32Gi")
    assert cfg.generator.resources == PodResources(cpu="8", memory="64Gi", gpus=1, shm="16Gi")


def test_resources_given_in_part_keep_the_sections_defaults_and_numbers_read_as_quantities(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("learner:\n  nodes: 4\n  resources: {gpus: 4, cpu: 48}\ngenerator:\n  resources: {memory: 32Gi}\n")
    cfg = load_config(p)
    assert cfg.learner.nodes == 4
    assert cfg.learner.resources == PodResources(cpu="48", memory="256Gi", gpus=4, shm="32Gi")
    assert cfg.generator.resources == PodResources(cpu="8", memory="32Gi", gpus=1, shm="16Gi")


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("learner:\n  resources: {gpus: -1}\n",
         "learner.resources.gpus: Input should be greater than or equal to 0, got -1"),
        ("learner:\n  resources: {memory: 64 GB}\n",
         "learner.resources.memory: not a Kubernetes quantity such as '8', '500m' or '64Gi', got '64 GB'"),
        ("generator:\n  resources: {cpu: 0}\n", "generator.resources.cpu: must be greater than 0, got 0"),
        ("generator:\n  resources: {gpu: 1}\n", "generator.resources.gpu: unknown field (did you mean generator.resources.gpus?)"),
        ("learner:\n  nodes: 65\n", "learner.nodes: Input should be less than or equal to 64, got 65"),
        ("learner:\n  resources: {memory: 16Gi}\n",
         "learner.resources: shm (32Gi) must not exceed memory (16Gi): /dev/shm counts against the memory limit"),
    ],
)
def test_a_bad_resource_value_is_one_line_naming_the_field(tmp_path, capsys, yaml_text, expected):
    p = tmp_path / "c.yaml"
    p.write_text(yaml_text)
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert str(err.value) == f"{p}: {expected}"
    assert main(["validate-config", str(p)]) == 2
    assert capsys.readouterr().err.strip() == f"posttrain: config error: {p}: {expected}"


def test_staleness_rule_is_token_or_episode_and_a_wrong_value_names_the_field_and_the_choices():
    assert load_config(None, []).sao.staleness_rule == "token"
    assert load_config(None, ["sao.staleness_rule=episode"]).sao.staleness_rule == "episode"
    with pytest.raises(ConfigError, match=r"sao.staleness_rule.*'token' or 'episode'"):
        load_config(None, ["sao.staleness_rule=turn"])


def test_gkd_cross_checks_name_their_fields():
    """lambda < 1 needs fixed sequences; the sampled reverse KL needs every row sampled by the student at the
    loss temperature; the stream must hold (checkpoint_every + tau + 2) x on-policy rows. lambda 0 (supervised
    KD) is every row fixed."""
    gkd = ["technique=gkd"]
    with pytest.raises(ConfigError, match=r"gkd\.data_path: required when gkd\.lmbda < 1 .* 16 fixed rows"):
        load_config(None, [*gkd, "gkd.lmbda=0.5"])
    with pytest.raises(ConfigError, match=r"sampled_reverse_kl needs student samples only: gkd\.lmbda \(0\.5\)"):
        load_config(None, [*gkd, "gkd.lmbda=0.5", "gkd.data_path=x.jsonl", "gkd.loss.divergence=sampled_reverse_kl"])
    with pytest.raises(ConfigError, match=r"generator\.temperature \(0\.7\) must equal gkd\.loss\.temperature \(1\.0\)"):
        load_config(None, [*gkd, "gkd.loss.divergence=sampled_reverse_kl", "generator.temperature=0.7"])
    with pytest.raises(ConfigError, match=r"gkd\.data_path: required when gkd\.lmbda < 1 .* leaves 32 fixed rows"):
        load_config(None, [*gkd, "gkd.lmbda=0"])
    with pytest.raises(ConfigError, match=r"sampled_reverse_kl needs student samples only: gkd\.lmbda \(0\.0\)"):
        load_config(None, [*gkd, "gkd.lmbda=0", "gkd.data_path=x.jsonl", "gkd.loss.divergence=sampled_reverse_kl"])
    with pytest.raises(ConfigError, match=r"gkd\.lmbda: Input should be greater than or equal to 0"):
        load_config(None, [*gkd, "gkd.lmbda=-0.1"])
    supervised = load_config(None, [*gkd, "gkd.lmbda=0", "gkd.data_path=x.jsonl", "queue.maxlen=10"])
    assert (supervised.gkd.on_policy_rows, supervised.gkd.fixed_rows) == (0, 32)  # no stream: maxlen is moot
    with pytest.raises(ConfigError, match=r"gkd\.loss\.beta: Input should be less than or equal to 1"):
        load_config(None, [*gkd, "gkd.loss.beta=1.5"])
    with pytest.raises(ConfigError, match=r"queue\.maxlen \(10\) .* on-policy rows round\(gkd\.lmbda x gkd\.batch_size\)"):
        load_config(None, [*gkd, "queue.maxlen=10"])
    cfg = load_config(None, [*gkd, "gkd.lmbda=0.25", "gkd.batch_size=10", "gkd.micro_batch_size=5",
                             "gkd.data_path=x.jsonl", "generator.temperature=0.7"])  # the JSD samples at any temperature
    assert (cfg.gkd.on_policy_rows, cfg.gkd.fixed_rows) == (2, 8)  # round(2.5) = 2


def test_gkd_run_with_a_missing_teacher_prints_one_line_and_exits_2(tmp_path, capsys):
    gkd = next(p for p in CONFIGS if p.name == "gkd_cpu.yaml")
    for teacher, expected in ((tmp_path / "none", f"gkd.teacher.path: {tmp_path / 'none'} is not a directory"),
                              ("models:/team@champion", "gkd.teacher.path: models:/team@champion is not a local directory")):
        code = main(["run", str(gkd), f"gkd.teacher.path={teacher}", f"output_dir={tmp_path / 'runs'}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("override", "message"), [
    ("sao.critic.head_bias_init=mean", r"sao\.critic\.head_bias_init: allowed values are 'zero' or 'first_batch_mean'"),
    ("sao.loss.denominator=fresh",
     r"sao\.loss\.denominator: allowed values are 'all_action_tokens' or 'fresh_tokens'"),
    ("sao.critic.warmup_steps=-1", r"sao\.critic\.warmup_steps: Input should be greater than or equal to 0"),
    ("sao.critic.warmup_steps=100001", r"sao\.critic\.warmup_steps: Input should be less than or equal to 100000"),
    ("sao.whiten_advantages=maybe", r"sao\.whiten_advantages: Input should be a valid boolean"),
    ("sao.critic.head_weight_std=-0.1", r"sao\.critic\.head_weight_std: Input should be greater than or equal to 0"),
    ("sao.critic.head_weight_std=2", r"sao\.critic\.head_weight_std: Input should be less than or equal to 1"),
])
def test_critic_options_out_of_range_name_the_field_and_the_allowed_values(override, message):
    """Issue 29's critic options: a bad value is one line naming the field and what it may be."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_critic_options_default_to_the_earlier_behaviour():
    sao = load_config(None, []).sao
    assert (sao.critic.head_bias_init, sao.critic.head_weight_std, sao.whiten_advantages, sao.loss.denominator) == (
        "zero", 0.0, False, "all_action_tokens")
    on = load_config(None, ["sao.critic.head_bias_init=first_batch_mean", "sao.whiten_advantages=true",
                            "sao.loss.denominator=fresh_tokens", "sao.critic.warmup_steps=0"]).sao
    assert (on.critic.head_bias_init, on.whiten_advantages, on.loss.denominator, on.critic.warmup_steps) == (
        "first_batch_mean", True, "fresh_tokens", 0)


@pytest.mark.parametrize(("override", "message"), [
    ("gateway.batch_wait_ms=-1", r"gateway\.batch_wait_ms: Input should be greater than or equal to 0"),
    ("gateway.batch_wait_ms=10001", r"gateway\.batch_wait_ms: Input should be less than or equal to 10000"),
    ("gateway.batch_wait_ms=soon", r"gateway\.batch_wait_ms: Input should be a valid number"),
])
def test_gateway_batch_wait_out_of_range_names_the_field_and_the_bound(override, message):
    """Issue 33: the batching gate's longest wait is 0 (no gate) to 10 s, one line naming it otherwise."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_gateway_batch_wait_takes_its_bounds_and_defaults_to_20_ms():
    assert load_config(None, []).gateway.batch_wait_ms == 20.0
    for ms in (0, 10000):
        assert load_config(None, [f"gateway.batch_wait_ms={ms}"]).gateway.batch_wait_ms == ms
