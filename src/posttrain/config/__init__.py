"""Run configuration: pydantic v2 models, YAML loading and dotted ``key=value`` overrides.

This package imports no torch, so ``posttrain validate-config`` is instant.
"""

from posttrain.config.load import ConfigError, load_config, parse_overrides
from posttrain.config.models import (
    CriticConfig,
    DataConfig,
    DPOLossConfig,
    EvalConfig,
    GeneratorConfig,
    GRPOLossConfig,
    ModelConfig,
    OptimConfig,
    QueueConfig,
    RunConfig,
    SAOConfig,
    SAOLossConfig,
    SFTConfig,
    TinyModelConfig,
    TrackingConfig,
)

__all__ = [
    "ConfigError",
    "DPOLossConfig",
    "GRPOLossConfig",
    "CriticConfig",
    "DataConfig",
    "EvalConfig",
    "GeneratorConfig",
    "ModelConfig",
    "OptimConfig",
    "QueueConfig",
    "RunConfig",
    "SAOConfig",
    "SAOLossConfig",
    "SFTConfig",
    "TinyModelConfig",
    "TrackingConfig",
    "load_config",
    "parse_overrides",
]
