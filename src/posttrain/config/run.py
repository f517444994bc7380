"""Pydantic models for every run config section. Each field carries its meaning and bounds.

A YAML run config is one ``RunConfig``; ``posttrain validate-config FILE`` checks it. Unknown
keys are errors (``extra="forbid"``), so a typo never silently falls back to a default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from posttrain.config.common import _Strict
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
    GRPOTechniqueConfig,
    SFTTechniqueConfig,
)


class RunConfig(_Strict):
    """A whole run: technique, model, data, and the settings of each role."""

    technique: Literal["sao", "sft", "cpt", "dpo", "grpo"] = "sao"
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

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        if self.technique == "grpo" and self.grpo.async_ and self.generator.top_p != 1.0:
            raise ValueError(
                "generator.top_p must be 1.0 with technique=grpo and grpo.async true (the DIS ratio needs "
                f"full-softmax behaviour logprobs), got {self.generator.top_p}"
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
            if self.sao.micro_batch_size > self.sao.batch_size:
                raise ValueError(
                    f"sao.micro_batch_size ({self.sao.micro_batch_size}) must be <= sao.batch_size "
                    f"({self.sao.batch_size})"
                )
        return self
