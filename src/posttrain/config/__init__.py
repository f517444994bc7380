"""Run configuration: pydantic v2 models, YAML loading and dotted ``key=value`` overrides.

This package imports no torch, so ``posttrain validate-config`` is instant.
"""

from posttrain.config.common import DPOLossConfig, GKDLossConfig, GRPOLossConfig, OptimConfig, SAOLossConfig
from posttrain.config.gateway import GatewayConfig
from posttrain.config.load import ConfigError, load_config, parse_overrides
from posttrain.config.resources import PodResources
from posttrain.config.run import RunConfig
from posttrain.config.sections import (
    CriticConfig,
    DataConfig,
    EvalConfig,
    GeneratorConfig,
    LearnerConfig,
    ModelConfig,
    QueueConfig,
    SAOConfig,
    SFTConfig,
    TinyModelConfig,
    TrackingConfig,
)
from posttrain.config.techniques import (
    DPOTechniqueConfig,
    GKDTechniqueConfig,
    GRPOTechniqueConfig,
    SFTTechniqueConfig,
    TeacherConfig,
)

__all__ = [
    "ConfigError",
    "DPOLossConfig",
    "DPOTechniqueConfig",
    "GKDLossConfig",
    "GKDTechniqueConfig",
    "GRPOTechniqueConfig",
    "SFTTechniqueConfig",
    "GRPOLossConfig",
    "CriticConfig",
    "DataConfig",
    "EvalConfig",
    "GatewayConfig",
    "GeneratorConfig",
    "LearnerConfig",
    "ModelConfig",
    "OptimConfig",
    "PodResources",
    "QueueConfig",
    "RunConfig",
    "SAOConfig",
    "SAOLossConfig",
    "SFTConfig",
    "TeacherConfig",
    "TinyModelConfig",
    "TrackingConfig",
    "load_config",
    "parse_overrides",
]
