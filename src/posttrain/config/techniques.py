"""Run-config sections of the techniques beside SAO: ``sft:`` (also ``cpt``), ``dpo:``, ``grpo:`` and ``gkd:``.

Each section holds what differs between techniques (data file, batch shape, loss); the
optimizer (``OptimConfig``), the checkpoint format and the metric names are shared. The sections
are plain pydantic v2 models with ``extra="forbid"``; ``RunConfig`` carries one field per section.
This module imports no torch.

Example (YAML)::

    technique: grpo
    grpo:
      group_size: 4
      async: true            # the asynchronous runtime with DIS masking ("GRPO + DIS")
      loss: {dis_mask: true}

Check a file with ``posttrain validate-config FILE``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from posttrain.config.common import DPOLossConfig, GKDLossConfig, GRPOLossConfig, OptimConfig, _Strict


class _Section(_Strict):
    """A technique section: ``_Strict`` (unknown keys and true/false numbers refused), fields also by alias."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, validate_by_name=True, validate_by_alias=True,
        serialize_by_alias=True,
    )


class SFTTechniqueConfig(_Section):
    """Supervised fine-tuning on chat data (``technique: sft``) or raw text (``technique: cpt``).

    ``sft`` trains on assistant tokens only; ``cpt`` (continued pre-training) on every token of
    each document except its first. Examples are packed into rows of ``max_seq_len`` tokens when
    ``packing`` is on; the loss is divided by the global count of trained tokens of the step.
    """

    data_path: str | None = None
    """JSONL file: ``{"messages": [...]}`` rows for sft, ``{"text": ...}`` rows for cpt (docs/data.md). Required."""
    max_examples: int | None = Field(None, ge=1, le=100_000_000)
    """Use only the first this many valid rows (None: all)."""
    steps: int = Field(100, ge=1, le=10_000_000)
    """Optimizer steps."""
    batch_size: int = Field(8, ge=1, le=65536)
    """Rows per optimizer step: packed rows of up to ``max_seq_len`` tokens, or examples without packing."""
    micro_batch_size: int = Field(4, ge=1, le=65536)
    """Rows per forward/backward; gradients accumulate over the step's rows."""
    max_seq_len: int = Field(512, ge=16, le=131072)
    """Row length (tokens); longer examples are truncated to it."""
    packing: bool = True
    """Pack several examples into one row (block-diagonal attention, positions restart per example)."""
    checkpoint_every: int = Field(50, ge=1)
    """Write a learner checkpoint every this many optimizer steps (and at the end)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5, warmup_steps=10, schedule="cosine"))
    """Optimizer and LR schedule."""

    @model_validator(mode="after")
    def _micro_batch(self) -> SFTTechniqueConfig:
        if self.micro_batch_size > self.batch_size:
            raise ValueError(
                f"sft.micro_batch_size ({self.micro_batch_size}) must be <= sft.batch_size ({self.batch_size})"
            )
        return self


class DPOTechniqueConfig(_Section):
    """Direct preference optimisation on ``{prompt, chosen, rejected}`` pairs (``technique: dpo``)."""

    data_path: str | None = None
    """JSONL file of ``{"prompt", "chosen", "rejected"}`` rows (docs/data.md). Required."""
    max_examples: int | None = Field(None, ge=1, le=100_000_000)
    """Use only the first this many valid pairs (None: all)."""
    heldout_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """Fraction of pairs kept out of training to measure preference accuracy before and after."""
    steps: int = Field(100, ge=1, le=10_000_000)
    """Optimizer steps."""
    batch_size: int = Field(8, ge=1, le=65536)
    """Pairs per optimizer step."""
    micro_batch_size: int = Field(4, ge=1, le=65536)
    """Pairs per forward/backward (chosen and rejected run in one forward of 2 x this many rows)."""
    max_seq_len: int = Field(512, ge=16, le=131072)
    """Prompt plus response length (tokens); longer pairs are truncated from the right."""
    reference: Literal["precompute", "per_batch"] = "precompute"
    """Reference logprobs: computed once for every pair before training (the reference model is then
    freed), or recomputed by a frozen reference model for each batch (keeps it in memory)."""
    loss: DPOLossConfig = Field(default_factory=DPOLossConfig)
    """beta and label smoothing."""
    checkpoint_every: int = Field(50, ge=1)
    """Write a learner checkpoint every this many optimizer steps (and at the end)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=5e-7, warmup_steps=10))
    """Optimizer and LR schedule."""

    @model_validator(mode="after")
    def _micro_batch(self) -> DPOTechniqueConfig:
        if self.micro_batch_size > self.batch_size:
            raise ValueError(
                f"dpo.micro_batch_size ({self.micro_batch_size}) must be <= dpo.batch_size ({self.batch_size})"
            )
        return self


class GRPOTechniqueConfig(_Section):
    """Group relative policy optimisation (DeepSeekMath, arXiv 2402.03300), synchronous or asynchronous.

    Synchronous (``async: false``): generate ``prompts_per_step x group_size`` rollouts with the
    current weights, wait for all of them, then update. Asynchronous (``async: true``): the SAO
    runtime (generator processes, Redis stream, staleness bound) produces groups of
    ``group_size`` rollouts that share a ``group_id``; the learner trains on complete groups with
    the DIS mask against the behaviour logprobs (the paper's "GRPO + DIS" baseline).
    """

    steps: int = Field(50, ge=1, le=10_000_000)
    """Iterations; each trains on one batch of groups and publishes one policy version."""
    prompts_per_step: int = Field(16, ge=1, le=65536)
    """Groups (prompts) per batch (paper's GRPO control: 16)."""
    group_size: int = Field(8, ge=2, le=1024)
    """G: rollouts per prompt (paper's GRPO control: 8)."""
    micro_batch_size: int = Field(16, ge=1, le=65536)
    """Rollouts per forward/backward; gradients accumulate, normalised by the global action-token count."""
    mini_batches: int = Field(1, ge=1, le=1024)
    """Optimizer steps per batch: the batch's groups are split into this many mini-batches. With 1
    the PPO ratio only moves off 1 through staleness; with more, later mini-batches are off-policy
    and the clip acts."""
    drop_uniform_groups: bool = True
    """Drop groups whose rewards are all equal (zero advantage, no gradient; DAPO dynamic sampling
    without resampling); they are counted in ``grpo/uniform_groups_frac``."""
    normalize_std: bool = True
    """Divide advantages by the group's reward std (False: Dr. GRPO, r - mean)."""
    async_: bool = Field(False, alias="async")
    """Run over the asynchronous runtime (YAML key ``async``); requires ``loss.dis_mask``."""
    max_staleness: int = Field(4, ge=0, le=1000)
    """Asynchronous only: drop a group if any member's oldest policy version lags by more than this."""
    loss: GRPOLossConfig = Field(default_factory=GRPOLossConfig)
    """Clip range, k3 KL weight to the reference policy, optional DIS band."""
    checkpoint_every: int = Field(10, ge=1)
    """Write a learner checkpoint every this many iterations (and at the end)."""
    max_nonfinite_iterations: int = Field(3, ge=1, le=10_000)
    """Learner iterations in a row with a non-finite gradient norm before the run stops with an
    error. Each such optimizer step is skipped and counted in ``skipped_nonfinite``; an iteration
    whose every step was skipped makes no version. 1 stops at the first."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-6))
    """Policy optimizer (paper: constant 1e-6)."""

    @property
    def batch_rollouts(self) -> int:
        """Rollouts per batch: ``prompts_per_step * group_size``."""
        return self.prompts_per_step * self.group_size

    @model_validator(mode="after")
    def _cross_checks(self) -> GRPOTechniqueConfig:
        if self.async_ and not self.loss.dis_mask:
            raise ValueError(
                "grpo.async is true but grpo.loss.dis_mask is false: asynchronous GRPO trains on stale "
                "rollouts and needs the DIS mask against the behaviour logprobs (set grpo.loss.dis_mask: true)"
            )
        if self.mini_batches > self.prompts_per_step:
            raise ValueError(
                f"grpo.mini_batches ({self.mini_batches}) must be <= grpo.prompts_per_step "
                f"({self.prompts_per_step}): a mini-batch holds whole groups"
            )
        return self


class TeacherConfig(_Section):
    """The teacher GKD distils from (``gkd.teacher``): a model directory, or one built for the run.

    The teacher must share the student's tokenizer: its vocabulary (logits' last dimension) must
    equal the student's, else the run stops with one line naming ``gkd.teacher.path``.
    """

    path: str | None = None
    """Teacher model: a local transformers directory, an ``s3://`` URI (downloaded before training) or,
    in pipelines, ``models:/<name>@<alias>`` / ``models:/<name>/<version>`` (resolved by
    ``prepare_dataset`` through the MLflow registry: distil a team's RL champion). None: the run builds
    one, ``<run>/teacher_model``: the base model trained by SFT on the environment's reference
    episodes for ``build_steps`` steps (the warm start trained much longer), so a config is
    self-contained on a fresh machine."""
    build_steps: int = Field(600, ge=1, le=10_000_000)
    """SFT steps of the teacher built when ``path`` is None (batch size and optimizer of ``warm_start``);
    the student is the warm start of ``warm_start.steps`` steps. Ignored when ``path`` is set."""


class GKDTechniqueConfig(_Section):
    """Generalized knowledge distillation, on-policy (Agarwal et al., ICLR 2024, arXiv 2306.13649; ``technique: gkd``).

    The student (the warm start) learns the teacher's next-token distributions on a mix of its own
    samples and fixed sequences. Each learner batch has ``batch_size`` sequences:
    ``round(lmbda * batch_size)`` on-policy rollouts the generators sampled from the student on the
    environment's tasks (through the inference engine, the rollout stream and admission, as SAO's),
    and the rest drawn from the fixed sequences of ``data_path``. With ``lmbda: 0`` every sequence is
    fixed (supervised KD, which the paper includes): no generator, engine or rollout stream runs. The teacher scores every
    sequence in the learner (frozen, placed and sharded like the student). Sampling settings of
    the on-policy rollouts (engine, temperature, top_p, tokens per turn, processes, episodes in
    flight) are the ``generator`` section's, as for every technique of the asynchronous runtime.
    """

    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    """The teacher (path, or the SFT steps of one built for the run)."""
    lmbda: float = Field(1.0, ge=0.0, le=1.0)
    """lambda, the on-policy share: ``round(lmbda * batch_size)`` sequences of each batch are the student's
    own samples (at least one when lambda > 0), the rest fixed sequences from ``data_path`` (paper: the
    student-data fraction; on-policy, 1.0, worked best). 0 is supervised KD: every sequence is fixed
    and scored by the teacher, no generator or inference engine is started and no rollout is awaited."""
    data_path: str | None = None
    """JSONL of fixed (off-policy) sequences, chat rows ``{"messages": [...]}`` as for sft (docs/data.md):
    ground-truth or teacher-written answers; their assistant tokens are trained. Required when
    ``lmbda < 1``, unused at 1."""
    max_examples: int | None = Field(None, ge=1, le=100_000_000)
    """Use only the first this many valid rows of ``data_path`` (None: all)."""
    max_seq_len: int = Field(512, ge=16, le=131072)
    """Fixed sequences are truncated to this many tokens."""
    steps: int = Field(50, ge=1, le=10_000_000)
    """Optimizer steps, one policy version each (generators sample with the newest published version)."""
    batch_size: int = Field(32, ge=1, le=65536)
    """Sequences per optimizer step, on-policy and fixed together."""
    micro_batch_size: int = Field(16, ge=1, le=65536)
    """Sequences per forward/backward (student and teacher); gradients accumulate, normalised by the
    step's count of trained tokens."""
    max_staleness: int = Field(1, ge=0, le=1000)
    """tau (policy versions): an on-policy rollout whose oldest turn lags the learner by more than this is
    dropped (and cancelled in flight by the generators); admission starts no rollout that would be.
    0 is strictly on-policy (generators and learner take turns); 1 lets the next batch be sampled
    while the learner trains."""
    loss: GKDLossConfig = Field(default_factory=GKDLossConfig)
    """Divergence (generalised JSD or sampled reverse KL), beta, temperature."""
    checkpoint_every: int = Field(10, ge=1)
    """Write a learner checkpoint (and acknowledge the consumed stream entries) every this many versions."""
    max_nonfinite_iterations: int = Field(3, ge=1, le=10_000)
    """Learner iterations in a row with a non-finite gradient norm before the run stops with an error.
    Each such optimizer step is skipped (no version) and counted in ``skipped_nonfinite``."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Student optimizer and LR schedule."""

    @property
    def on_policy_rows(self) -> int:
        """On-policy rollouts per batch: ``round(lmbda * batch_size)``, at least 1 when ``lmbda > 0``; 0 at ``lmbda`` 0."""
        return max(1, round(self.lmbda * self.batch_size)) if self.lmbda > 0 else 0

    @property
    def fixed_rows(self) -> int:
        """Fixed sequences per batch: ``batch_size - on_policy_rows``."""
        return self.batch_size - self.on_policy_rows

    @model_validator(mode="after")
    def _cross_checks(self) -> GKDTechniqueConfig:
        if self.micro_batch_size > self.batch_size:
            raise ValueError(
                f"gkd.micro_batch_size ({self.micro_batch_size}) must be <= gkd.batch_size ({self.batch_size})"
            )
        if self.loss.divergence == "sampled_reverse_kl" and self.fixed_rows:
            raise ValueError(
                f"gkd.loss.divergence sampled_reverse_kl needs student samples only: gkd.lmbda ({self.lmbda}) "
                f"x gkd.batch_size ({self.batch_size}) leaves {self.fixed_rows} fixed rows per batch; set gkd.lmbda: 1"
            )
        if self.fixed_rows and not self.data_path:
            raise ValueError(
                f"gkd.data_path: required when gkd.lmbda < 1 (gkd.lmbda {self.lmbda} x gkd.batch_size "
                f"{self.batch_size} leaves {self.fixed_rows} fixed rows per batch; a JSONL of chat rows, docs/data.md)"
            )
        return self
