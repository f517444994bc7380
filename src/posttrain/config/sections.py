"""The run config's sections for model, data, warm start, SAO, generator, learner, queue, tracking and eval."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from posttrain.config.common import OptimConfig, SAOLossConfig, _Strict
from posttrain.config.environments import ENVIRONMENT_ARGUMENTS, env_args_problem, unknown_env_args
from posttrain.config.resources import PodResources, fill_resources

MAX_LEARNER_NODES = 64
"""Upper bound of ``learner.nodes`` (learner pods of one SAO JobSet)."""
LEARNER_RESOURCES = PodResources(cpu="32", memory="256Gi", gpus=6, shm="32Gi")
"""Default of ``learner.resources``: 6 GPUs, so the default SAO JobSet (one learner pod and two
1-GPU generators, 8 GPUs) fits the example tenant's nominal quota of 8 (``manifests/overlays/team-a``)
and runs without borrowing, which Kueue may reclaim by preemption."""
GENERATOR_RESOURCES = PodResources(cpu="8", memory="64Gi", gpus=1, shm="16Gi")
"""Default of ``generator.resources``: one GPU."""


class TinyModelConfig(_Strict):
    """Shape of the tiny Qwen2-style model built from scratch for CPU runs."""

    hidden_size: int = Field(128, ge=32, le=4096)
    """Model width; hidden_size / num_heads (head_dim) must be >= 32 for vLLM's CPU attention."""
    num_layers: int = Field(2, ge=1, le=64)
    """Transformer blocks."""
    num_heads: int = Field(2, ge=1, le=64)
    """Attention heads."""
    num_kv_heads: int = Field(1, ge=1, le=64)
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = Field(256, ge=32, le=16384)
    """MLP width."""
    vocab_size: int = Field(1024, ge=300, le=65536)
    """Tokenizer vocabulary trained locally (tokens)."""
    max_position_embeddings: int = Field(1024, ge=64, le=32768)
    """Longest sequence (tokens)."""

    @model_validator(mode="after")
    def _head_dim(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads or self.hidden_size // self.num_heads < 32:
            raise ValueError(
                f"model.tiny.hidden_size / model.tiny.num_heads must be an integer >= 32 (head_dim), "
                f"got {self.hidden_size}/{self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.tiny.num_kv_heads ({self.num_kv_heads}) must divide model.tiny.num_heads ({self.num_heads})"
            )
        return self


class ModelConfig(_Strict):
    """Which base model to train: a local/S3 path, or a tiny model built from ``tiny``."""

    path: str | None = None
    """Local directory or ``s3://`` URI of a transformers model with its tokenizer. None: build ``tiny``."""
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    """Shape used when ``path`` is None."""


class DataConfig(_Strict):
    """Which tasks to train and evaluate on."""

    env: Literal["synthetic_arith", "synthetic_tool", "synthetic_longtail", "gsm8k", "math_tool", "swe"] = (
        "synthetic_arith"
    )
    """Environment (and task family); ``synthetic_longtail`` is the long-tailed tool-call task of the benchmarks."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Constructor arguments of the environment (e.g. ``{low: 0, high: 20}`` for synthetic_arith); every
    key must be an argument of ``env``'s constructor (checked when the config is validated)."""
    train_path: str | None = None
    """Task file for training (JSONL); None uses the environment's built-in source."""
    eval_path: str | None = None
    """Held-out task file (JSONL); None uses the environment's built-in held-out split."""
    num_train_tasks: int = Field(2000, ge=1, le=10_000_000)
    """Tasks drawn for training (synthetic tasks are generated; files are truncated)."""
    num_eval_tasks: int = Field(100, ge=1, le=100_000)
    """Held-out tasks for evaluation."""
    on_bad_row: Literal["stop", "quarantine"] = "stop"
    """Malformed dataset row: stop with file:line:field, or write it to a quarantine file and go on."""
    seed: int = Field(0, ge=0)
    """Seed for synthetic task generation and shuffling."""

    @field_validator("env_args")
    @classmethod
    def _env_args_fit_env(cls, env_args: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Reject unknown keys, values of the wrong type, and oversized or deeply nested values.

        Each was a traceback at run time (``env_args_problem`` checks type, size and depth).
        """
        env = info.data.get("env")
        if env is None:  # ``env`` itself failed validation; that error is reported instead.
            return env_args
        unknown = unknown_env_args(env, env_args)
        if unknown:
            others = f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
            raise PydanticCustomError(
                "env_args_unknown",
                "unknown key data.env_args.{key} for data.env='{env}'{others}; {env} accepts: {accepted}",
                {"key": unknown[0], "env": env, "others": others,
                 "accepted": ", ".join(ENVIRONMENT_ARGUMENTS[env]) or "no arguments"},
            )
        problem = env_args_problem(env, env_args)  # a wrong type or an alias bomb: caught here, not at run time
        if problem:
            raise PydanticCustomError("env_args_value", "{problem}", {"problem": problem})
        return env_args


class SFTConfig(_Strict):
    """Supervised fine-tuning (also the warm start before RL)."""

    steps: int = Field(200, ge=0, le=10_000_000)
    """Optimizer steps."""
    batch_size: int = Field(32, ge=1, le=65536)
    """Examples per optimizer step."""
    max_seq_len: int = Field(256, ge=16, le=131072)
    """Truncate examples to this many tokens."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=3e-3))
    """Optimizer."""
    max_reference_turns: int | None = Field(None, ge=1, le=100_000)
    """Train only on reference episodes of at most this many assistant turns (None: all). On
    ``synthetic_longtail`` 5 keeps the tasks of at most 4 required calls, so the warm start solves
    most short tasks and few long ones and RL has room to learn (issue 29)."""


class CriticConfig(_Strict):
    """SAO critic (value model): init from the policy, scalar value head (zero, or bias from the first batch)."""

    lr: float = Field(5e-6, gt=0.0, le=1.0)
    """Critic learning rate (paper: 5e-6 vs actor 1e-6)."""
    updates_per_step: int = Field(2, ge=1, le=16)
    """K critic updates per policy update (paper: 2)."""
    warmup_steps: int = Field(10, ge=0, le=100_000)
    """Critic-only learner iterations before the policy trains (paper: 10; 0 to 100000). Each trains the
    critic K times on a batch of rollouts of the start policy and publishes no version: with a warm
    start, these iterations are value pretraining on warm-start rollouts. Counted by the learner's
    iteration number, which the checkpoint keeps, so a resumed run does not repeat them. Only with
    ``advantage: gae``."""
    value_clip: float = Field(0.2, gt=0.0, le=100.0)
    """Clip of V_new around V_old in the value loss."""
    grad_clip: float = Field(1.0, gt=0.0, le=1000.0)
    """Critic gradient-norm clip."""
    head_weight_std: float = Field(0.0, ge=0.0, le=1.0)
    """Standard deviation of the value head's initial weights (0 to 1; 0: zero weight). A zero weight
    passes no gradient into the backbone until the head has grown, so the critic is slow to learn a
    feature the start policy does not expose. Drawn from a fixed seed: every rank has the same head."""
    head_bias_init: Literal["zero", "first_batch_mean"] = "zero"
    """zero: the value head's bias starts at 0 (with its zero weight, V = 0 everywhere). first_batch_mean:
    before the critic's first update (learner iteration 0), the bias is set to the mean reward of that
    batch over every rank's rows, so the critic does not spend its first versions learning the bias.
    Never redone on resume (a resumed run starts past iteration 0; the bias is in the critic checkpoint)."""


class SAOConfig(_Strict):
    """Single-rollout asynchronous optimisation (arXiv 2607.07508) learner settings."""

    steps: int = Field(50, ge=1, le=10_000_000)
    """Policy optimizer steps (policy versions published)."""
    batch_size: int = Field(32, ge=1, le=65536)
    """Rollouts per optimizer step, of different prompts (paper: 128)."""
    micro_batch_size: int = Field(16, ge=1, le=65536)
    """Rollouts per forward/backward; gradients accumulate, normalised by the global action-token count."""
    max_staleness: int = Field(4, ge=0, le=1000)
    """tau (policy versions): how far behind the learner a token's or rollout's policy version may
    be and still train (``staleness_rule``); admission control never starts more than this allows."""
    staleness_rule: Literal["token", "episode"] = "token"
    """token: each action token trains only if the policy version that sampled it is within
    ``max_staleness`` of the learner's; older tokens are masked like DIS-masked ones (counted in
    ``mask/frac_stale``), the episode's fresh turns train and the critic learns from the whole
    episode; a rollout is dropped only when none of its action tokens is fresh, and generators
    never cancel an episode in flight (they load new weights between turns, so later turns are
    fresh). episode: the first rule, kept for side-by-side runs: a rollout whose *oldest* turn
    lags by more than ``max_staleness`` is dropped whole, and generators cancel it in flight
    (``generator.abort_stale_episodes``)."""
    loss: SAOLossConfig = Field(default_factory=SAOLossConfig)
    """DIS band."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-6))
    """Policy optimizer (paper: constant 1e-6)."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """Critic settings."""
    advantage: Literal["gae", "batch_norm", "running_mean"] = "gae"
    """gae: critic + skip-observation GAE (SAO); batch_norm: critic-free batch whitening; running_mean: weak baseline."""
    whiten_advantages: bool = False
    """Whiten the step's advantages, A <- (A - mean) / (std + 1e-6), with mean and std over the fresh
    (not stale-masked) action tokens of the whole batch, pooled over the ranks (OpenRLHF's advantage
    whitening). Applies whatever ``advantage`` is; off keeps the estimator's own scale."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount."""
    lam_alpha: float = Field(1.5, gt=0.0, le=1000.0)
    """alpha of the length-adaptive policy lambda = 1 - 1/(alpha * l)."""
    gae_lambda_critic: float = Field(1.0, ge=0.0, le=1.0)
    """lambda for the critic's returns (paper: 1, Monte-Carlo)."""
    running_mean_window: int = Field(8, ge=1, le=100_000)
    """Window (rollouts) of the running-mean baseline."""
    checkpoint_every: int = Field(5, ge=1)
    """Checkpoint (and acknowledge consumed stream entries) every this many policy steps."""
    max_nonfinite_iterations: int = Field(3, ge=1, le=10_000)
    """Learner iterations in a row with a non-finite gradient norm before the run stops with an
    error. Each such optimizer step (critic or policy) is skipped and counted in
    ``skipped_nonfinite``; a skipped policy step makes no version. 1 stops at the first."""


class GeneratorConfig(_Strict):
    """Generator processes: engine, sampling and concurrency."""

    engine: Literal["auto", "vllm", "hf"] = "auto"
    """auto: vllm where it imports, else hf."""
    num_processes: int = Field(2, ge=1, le=1024)
    """Generator processes started by ``posttrain run``."""
    episodes_in_flight: int = Field(8, ge=1, le=4096)
    """Concurrent episodes per generator process."""
    max_new_tokens: int = Field(48, ge=1, le=131072)
    """Tokens per turn."""
    max_turns: int = Field(4, ge=1, le=1000)
    """Turns per episode."""
    max_episode_tokens: int = Field(512, ge=16, le=1_000_000)
    """Total tokens per rollout (prompt, actions and observations)."""
    episode_timeout_s: float = Field(120.0, gt=0.0, le=86400.0)
    """Wall time per episode (seconds)."""
    admission_lease_s: float = Field(300.0, gt=0.0, le=7 * 86400.0)
    """An admission ticket not used within this many seconds expires, so a killed generator's
    tickets return to the pool; keep it above ``episode_timeout_s``."""
    heartbeat_ttl_s: float = Field(30.0, ge=1.0, le=3600.0)
    """A generator renews its heartbeat key in Redis about once a second with this TTL (seconds);
    when it dies the key lapses within this time, the learner returns its admission tickets at once
    and counts it as no longer alive (``learner.no_generator_timeout_s``)."""
    abort_stale_episodes: bool = True
    """With ``staleness_rule: episode`` (``sao`` section; asynchronous GRPO always), cancel an
    episode in flight as soon as its oldest policy version is more than ``max_staleness`` versions
    behind the learner's latest: the learner would drop its rollout anyway. Ignored under
    ``sao.staleness_rule: token``, where no episode is cancelled for its age. Its slot and admission ticket go to a new episode, and it is counted in the generator's
    ``stale_aborted``. False lets it finish, and the learner drops it (``stale_dropped``)."""
    infra_retries: int = Field(2, ge=0, le=100)
    """Times a task whose episode failed for the infrastructure (the sandbox died, the grader could
    not run, a tool was killed from outside) is run again; such an episode is never trained. After
    that many the task is given up with a log line naming it (``admission/abandoned_total``)."""
    max_infra_error_share: float = Field(0.25, ge=0.0, le=1.0)
    """The learner checkpoints and stops with one line once more than this share of the finished
    episodes failed for the infrastructure (counted over the run, after ``infra_min_episodes``):
    a broken sandbox or grader must not quietly eat the run. 1.0 never stops."""
    infra_min_episodes: int = Field(20, ge=1, le=1_000_000)
    """Finished episodes (trained or failed for the infrastructure) before
    ``max_infra_error_share`` is checked, so one early failure does not stop a run."""
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    """Sampling temperature; SAO training requires 1.0."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus mass; SAO training requires 1.0."""
    vllm_kv_cache_gib: int = Field(1, ge=1, le=1024)
    """vLLM CPU KV-cache size (GiB)."""
    resources: PodResources = GENERATOR_RESOURCES
    """What each generator pod of the SAO JobSet asks for (cluster mode; one pod per process,
    ``num_processes`` pods); fields left out keep this default. ``posttrain run`` on one machine
    ignores it."""

    @field_validator("resources", mode="before")
    @classmethod
    def _fill_resources(cls, value: Any) -> Any:
        return fill_resources(GENERATOR_RESOURCES, value)

    @model_validator(mode="after")
    def _turn_fits_the_episode(self) -> GeneratorConfig:
        """One turn's ``max_new_tokens`` must fit in the rollout's ``max_episode_tokens``.

        A larger one was accepted in silence and never applied: the episode runner cuts each turn to the
        tokens the episode has left.
        """
        if self.max_new_tokens > self.max_episode_tokens:
            raise ValueError(
                f"generator.max_new_tokens ({self.max_new_tokens}) must be <= generator.max_episode_tokens "
                f"({self.max_episode_tokens}): a turn generates up to max_new_tokens tokens, and a whole rollout "
                "(prompt, actions and observations) holds at most max_episode_tokens")
        return self


class LearnerConfig(_Strict):
    """Where and how the learner computes: device, precision, activation checkpointing; its pods on a cluster.

    On one machine the number of learner processes is ``torchrun --nproc_per_node N``'s. In the
    SAO JobSet (cluster mode) it is ``nodes`` pods × ``resources.gpus`` processes, each pod running
    ``torchrun`` (``posttrain.cluster.jobset``). With more than one process the policy, critic and
    reference model are sharded per transformer block with FSDP2 (``posttrain.parallel``).
    """

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA where torch sees a GPU, else the CPU. cuda where there is none is an error."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto: bf16 autocast on CUDA, fp32 on the CPU. bf16 keeps fp32 master weights and optimizer
    state and computes log-probabilities in fp32."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in backward (less memory, ~30% more compute)."""
    local_ranks: int = Field(1, ge=1, le=64)
    """Learner processes ``posttrain run`` starts on this machine for SAO and asynchronous GRPO: 1 runs
    the learner in the run's own process; N > 1 starts ``torchrun --standalone --nproc_per_node N
    -m posttrain.cli learner`` beside the generators (FSDP2 over N ranks). Cluster mode ignores it."""
    nodes: int = Field(1, ge=1, le=MAX_LEARNER_NODES)
    """Learner pods of the SAO JobSet (cluster mode); pod i is torchrun's ``--node_rank`` i. ``posttrain
    run`` on one machine ignores it."""
    no_generator_timeout_s: float = Field(600.0, ge=5.0, le=7 * 86400.0)
    """Seconds the learner waits for rollouts with no live generator (no heartbeat within
    ``generator.heartbeat_ttl_s``; counted from its start until the first one appears) before it
    checkpoints and stops with one line; meanwhile it prints a status line every 30 s."""
    max_iterations_without_progress: int = Field(20, ge=1, le=1_000_000)
    """Learner iterations in a row that train no token before the run checkpoints and stops with one
    line (SAO, synchronous and asynchronous GRPO; ``posttrain.learner.progress``): every GRPO group
    uniform (equal rewards), every rollout dropped as stale (each batch's worth of drops counts as one
    iteration), or every action token masked (staleness bound, DIS band). SAO's critic-only warm-up
    iterations do not count. The line names the cause and the shares of uniform groups, stale drops
    and masked tokens; every quarter of the bound without progress the console shows them first."""
    resources: PodResources = LEARNER_RESOURCES
    """What each learner pod asks for (cluster mode); fields left out keep this default. ``gpus`` is
    also torchrun's ``--nproc_per_node`` (1 when 0: one CPU process per pod)."""

    @field_validator("resources", mode="before")
    @classmethod
    def _fill_resources(cls, value: Any) -> Any:
        return fill_resources(LEARNER_RESOURCES, value)


class QueueConfig(_Strict):
    """Rollout stream on Redis Streams."""

    redis_url: str | None = None
    """redis:// URL; None reads REDIS_URL, and without it starts an embedded server."""
    key_prefix: str = Field("posttrain", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")
    """Prefix of every key of this run (``<prefix>:<run>:rollouts``); tenants get their own."""
    maxlen: int = Field(100_000, ge=10)
    """Approximate MAXLEN of the stream (entries). It must hold every entry the learner has not yet
    acknowledged, ``(checkpoint_every + max_staleness + 2) * batch rollouts`` (checked with the
    technique's section): a smaller stream trims entries that were trained but not checkpointed,
    and a crash would then lose them."""
    block_ms: int = Field(1000, ge=1, le=600_000)
    """XREADGROUP block (milliseconds)."""
    claim_idle_ms: int = Field(30_000, ge=1)
    """Pending entries idle this long (milliseconds) are reclaimed from other consumers (XPENDING IDLE + XCLAIM)."""
    reconnect_window_s: float = Field(30.0, ge=0.0, le=3600.0)
    """How long (seconds) every role keeps reconnecting to a Redis that stopped answering (backoff 0.2 s
    doubling to 2 s) before it stops with one line naming the URL; an outage shorter than this is
    survived. 0: no retries."""

    @field_validator("redis_url")
    @classmethod
    def _redis_url_parses(cls, value: str | None) -> str | None:
        """A malformed URL was a ValueError after 14 s of work at run time; refuse it here."""
        if value is not None:
            problem = redis_url_problem(value)
            if problem:
                raise ValueError(problem)
        return value


def redis_url_problem(url: str) -> str | None:
    """Why ``url`` is not a usable Redis URL, or None; credentials are never echoed.

    Accepted: ``redis://[user:pass@]host[:port][/db]``, ``rediss://...``, ``unix:///path``.

    Example: ``redis_url_problem("http://x")`` names the allowed schemes.
    """
    from urllib.parse import urlsplit

    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in ("redis", "rediss", "unix"):
        return f"expected a redis://, rediss:// or unix:// URL, got scheme {scheme or '(none)'!r}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a valid {scheme}:// URL: {exc}"
    if scheme == "unix":
        return None if parts.path else "unix:// URL needs a socket path (unix:///run/redis.sock)"
    if not parts.hostname:
        return f"{scheme}:// URL needs a host ({scheme}://HOST:PORT/DB)"
    if port == 0:
        return "port must be in 1..65535"
    db = parts.path.strip("/")
    if db and not db.isdigit():
        return f"database must be a number after the host (/0), got {db!r}"
    return None


class TrackingConfig(_Strict):
    """MLflow tracking and registry."""

    tracking_uri: str | None = None
    """MLflow URI; None uses MLFLOW_TRACKING_URI or ``sqlite:///<output_dir>/../mlflow.db``."""
    experiment: str = "posttrain"
    """Experiment name."""
    registered_model: str = "posttrain-policy"
    """Registered model the final checkpoint becomes a version of."""
    register_final: bool = True
    """Register the final checkpoint at the end of ``posttrain run``; pipelines set false and
    register in their own ``register_model`` step."""


class EvalConfig(_Strict):
    """Held-out evaluation after training."""

    num_tasks: int = Field(100, ge=1, le=100_000)
    """Held-out tasks."""
    samples_per_task: int = Field(1, ge=1, le=1024)
    """k for avg@k / pass@k."""
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    """0 means greedy."""
    infra_retries: int = Field(2, ge=0, le=100)
    """Times a sample whose episode or grading failed for the infrastructure (a sandbox that died or
    could not start, a grader or answer checker killed from outside: ``InfraError``) runs again, with
    the same seed; after that it is left out of the accuracy and counted by cause
    (``eval_<label>/infra_*``), never scored as a wrong answer."""
    max_infra_error_share: float = Field(0.1, ge=0.0, le=1.0)
    """Most samples left out for the infrastructure (a share of all samples) with which an accuracy
    is still reported; above it the evaluation refuses to give one, in one line: the samples that
    ran may not stand for the set (hard tasks time out sandboxes more often). 1.0 never refuses."""
