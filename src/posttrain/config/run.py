"""Pydantic models for every run config section. Each field carries its meaning and bounds.

A YAML run config is one ``RunConfig``; ``posttrain validate-config FILE`` checks it. Unknown
keys are errors (``extra="forbid"``), so a typo never silently falls back to a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from posttrain.config.common import _Strict
from posttrain.config.gateway import GatewayConfig
from posttrain.config.sections import (
    DataConfig,
    EvalConfig,
    GeneratorConfig,
    LearnerConfig,
    ModelConfig,
    QueueConfig,
    SAOConfig,
    SFTConfig,
    TrackingConfig,
)
from posttrain.config.techniques import (  # noqa: E402
    DPOTechniqueConfig,
    GKDTechniqueConfig,
    GRPOTechniqueConfig,
    SFTTechniqueConfig,
)


class RunConfig(_Strict):
    """A whole run: technique, model, data, and the settings of each role."""

    technique: Literal["sao", "sft", "cpt", "dpo", "grpo", "gkd"] = "sao"
    """Post-training technique."""
    run_name: str = Field("run", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
    """Run name: output directory, stream keys and MLflow run name derive from it."""
    output_dir: str = "runs"
    """Parent directory of run outputs (``<output_dir>/<run_name>``)."""
    weights_uri: str | None = None
    """Weight store the learner publishes to and generators read: None is ``<run dir>/weights``; a path
    or ``file://`` URI is a shared directory; ``s3://bucket/prefix`` is an S3 store (cluster mode)."""
    weights_timeout_s: float = Field(300.0, gt=0.0, le=86400.0)
    """Longest time (seconds) one read or write of the weight store may take (a ``LATEST`` read, a
    version lookup or download, a publish); past it the role stops with one line naming the
    operation (a hung NFS mount, an S3 endpoint that stops answering)."""
    final_model_uri: str | None = None
    """Where the learner also uploads its final model (a path, ``file://`` or ``s3://`` URI); None: only
    ``<run dir>/final_model``."""
    checkpoints_uri: str | None = None
    """``s3://bucket/prefix`` where the SAO learner also keeps its checkpoints and start model, so a
    restarted learner pod resumes (cluster mode; ``learner.remote_checkpoint``); None: local only."""
    seed: int = Field(0, ge=0)
    """Global seed."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    warm_start: SFTConfig = Field(default_factory=SFTConfig)
    """SFT warm start before RL (steps=0 disables it)."""
    sao: SAOConfig = Field(default_factory=SAOConfig)
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    """Learner device, precision and activation checkpointing (every technique); its pods and their
    resources in the SAO JobSet (cluster mode)."""
    queue: QueueConfig = Field(default_factory=QueueConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sft: SFTTechniqueConfig = Field(default_factory=SFTTechniqueConfig)
    """Techniques sft and cpt: data file, packing, batch shape, optimizer (posttrain.config.techniques)."""
    dpo: DPOTechniqueConfig = Field(default_factory=DPOTechniqueConfig)
    """Technique dpo: preference file, reference mode, beta, batch shape, optimizer."""
    grpo: GRPOTechniqueConfig = Field(default_factory=GRPOTechniqueConfig)
    """Technique grpo: group size, clipping, KL, uniform-group dropping, synchronous or asynchronous."""
    gkd: GKDTechniqueConfig = Field(default_factory=GKDTechniqueConfig)
    """Technique gkd: teacher, on-policy share lambda, divergence (beta, temperature), batch shape, optimizer."""
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    """The rollout gateway: an OpenAI-compatible server whose episodes train with SAO (docs/gateway.md)."""

    @field_validator("checkpoints_uri")
    @classmethod
    def _checkpoints_on_s3(cls, value: str | None) -> str | None:
        """Only ``s3://bucket[/prefix]``: a local path would not outlive the pod either."""
        if value is not None and (not value.startswith("s3://") or not value[5:].strip("/")):
            raise ValueError("checkpoints_uri must be an s3://bucket/prefix URI (or unset)")
        return value

    @field_validator("weights_uri", "final_model_uri")
    @classmethod
    def _location_scheme(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A path, ``file://`` URI or ``s3://bucket[/prefix]`` URI; any other scheme is an error."""
        if value is None:
            return value
        scheme, sep, rest = value.partition("://")
        if not value.strip() or (sep and (scheme not in ("s3", "file") or not rest.strip("/"))):
            raise ValueError(f"{info.field_name} must be a path, a file:// URI or an s3://bucket/prefix URI")
        return value

    @field_validator("output_dir")
    @classmethod
    def _output_dir_not_a_file(cls, value: str) -> str:
        """The nearest existing part of ``output_dir`` must be a directory (a file gave NotADirectoryError at run time)."""
        if "://" in value:
            raise ValueError(f"output_dir must be a local directory path, got {value!r}")
        path = Path(value)
        for part in (path, *path.parents):
            if part.exists():
                if not part.is_dir():
                    what = "is a file" if part == path else f"lies under {part}, which is a file"
                    raise ValueError(f"output_dir {value!r} {what}, not a directory")
                break
        return value

    @model_validator(mode="after")
    def _stream_holds_unacknowledged_entries(self) -> RunConfig:
        """``queue.maxlen`` must hold the entries the learner has not acknowledged (trimmed ones were lost after a crash).

        The learner acknowledges an entry only once the checkpoint after its optimizer step is
        written, so up to ``checkpoint_every`` batches are pending, one more batch is being read,
        and admission lets ``max_staleness + 1`` batches be unread on the stream: with B rollouts
        per batch, ``(checkpoint_every + max_staleness + 2) * B`` entries. Approximate trimming
        keeps at least ``maxlen`` entries, so this bound is enough.
        """
        if self.technique == "sao":
            every, tau, batch = self.sao.checkpoint_every, self.sao.max_staleness, self.sao.batch_size
            names = "sao.checkpoint_every, sao.max_staleness, sao.batch_size"
        elif self.technique == "grpo" and self.grpo.async_:
            every, tau = self.grpo.checkpoint_every, self.grpo.max_staleness
            batch = self.grpo.prompts_per_step * self.grpo.group_size
            names = "grpo.checkpoint_every, grpo.max_staleness, grpo.prompts_per_step x grpo.group_size"
        elif self.technique == "gkd":
            every, tau, batch = self.gkd.checkpoint_every, self.gkd.max_staleness, self.gkd.on_policy_rows
            names = "gkd.checkpoint_every, gkd.max_staleness, on-policy rows round(gkd.lmbda x gkd.batch_size)"
        else:
            return self
        bound = (every + tau + 2) * batch
        if self.queue.maxlen < bound:
            raise ValueError(
                f"queue.maxlen ({self.queue.maxlen}) must be >= (checkpoint_every + max_staleness + 2) x batch "
                f"= ({every} + {tau} + 2) x {batch} = {bound} entries ({names}), or the stream trims entries "
                "the learner has not acknowledged")
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        if self.learner.no_generator_timeout_s <= self.generator.heartbeat_ttl_s:
            raise ValueError(
                f"learner.no_generator_timeout_s ({self.learner.no_generator_timeout_s}) must be greater than "
                f"generator.heartbeat_ttl_s ({self.generator.heartbeat_ttl_s}): a live generator refreshes its "
                "heartbeat within one TTL, so a shorter wait would stop the learner beside working generators"
            )
        if self.technique == "grpo" and self.grpo.async_ and self.generator.top_p != 1.0:
            raise ValueError(
                "generator.top_p must be 1.0 with technique=grpo and grpo.async true (the DIS ratio needs "
                f"full-softmax behaviour logprobs), got {self.generator.top_p}"
            )
        if self.technique == "gkd":
            if self.generator.admission_lease_s <= self.generator.episode_timeout_s:
                raise ValueError(
                    f"generator.admission_lease_s ({self.generator.admission_lease_s}) must be greater than "
                    f"generator.episode_timeout_s ({self.generator.episode_timeout_s})"
                )
            loss = self.gkd.loss
            if loss.divergence == "sampled_reverse_kl" and (
                    self.generator.temperature != loss.temperature or self.generator.top_p != 1.0):
                raise ValueError(
                    "gkd.loss.divergence sampled_reverse_kl estimates KL(student || teacher) from the student's own "
                    f"samples: generator.temperature ({self.generator.temperature}) must equal gkd.loss.temperature "
                    f"({loss.temperature}) and generator.top_p ({self.generator.top_p}) must be 1.0"
                )
        if self.technique == "sao":
            if self.generator.temperature != 1.0 or self.generator.top_p != 1.0:
                raise ValueError(
                    "generator.temperature and generator.top_p must both be 1.0 for technique=sao "
                    "(behaviour logprobs must be of the full softmax), got "
                    f"{self.generator.temperature} and {self.generator.top_p}"
                )
            if self.generator.admission_lease_s <= self.generator.episode_timeout_s:
                raise ValueError(
                    f"generator.admission_lease_s ({self.generator.admission_lease_s}) must be greater than "
                    f"generator.episode_timeout_s ({self.generator.episode_timeout_s})"
                )
            self._gateway_checks()
            if self.sao.micro_batch_size > self.sao.batch_size:
                raise ValueError(
                    f"sao.micro_batch_size ({self.sao.micro_batch_size}) must be <= sao.batch_size "
                    f"({self.sao.batch_size})"
                )
        elif self.gateway.mode != "disabled":
            raise ValueError(
                f"gateway.mode {self.gateway.mode!r} needs technique sao (one rollout per episode; GRPO needs "
                f"groups of one task), got technique {self.technique!r}"
            )
        return self

    def _gateway_checks(self) -> None:
        """Cross-checks of the ``gateway`` section against the generator's bounds (technique sao)."""
        gw, gen = self.gateway, self.generator
        if gw.mode == "disabled":
            return
        if gw.idle_timeout_s >= gen.admission_lease_s:
            raise ValueError(
                f"gateway.idle_timeout_s ({gw.idle_timeout_s}) must be less than generator.admission_lease_s "
                f"({gen.admission_lease_s}): an abandoned episode must give its ticket back before the lease runs out"
            )
        if gw.agents and gw.verifier != "environment":
            raise ValueError(
                f"gateway.agents ({gw.agents}) needs gateway.verifier 'environment': the example agents close "
                f"their episodes with a task id, got verifier {gw.verifier!r}"
            )
