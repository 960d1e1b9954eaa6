"""PyTorch training library of Pollux: adaptive batch size, AdaScale, elastic checkpoints.

A replica trains with `ElasticTrainer`, which measures the job for the scheduler (step times,
gradient noise scale), follows the batch configuration chosen for its allocation, scales the
learning rate, and checkpoints atomically when the allocation changes. The control plane plugs
in through two protocols, `BatchConfigSource` (the batch size to use) and `MetricsSink` (where
measurements go); importing this package loads no gRPC. The user guide is docs/training.md.
"""

from pollux.train.checkpoint import CheckpointManager, StopSignal
from pollux.train.config import CheckpointConfig, ControlConfig, DataConfig, MeasureConfig
from pollux.train.data import (
    AdaptiveDataLoader,
    BatchConfig,
    BatchConfigSource,
    FixedBatchConfig,
    MicroBatchInfo,
    StepPlan,
    default_batch_config,
    plan_step,
)
from pollux.train.env import TrainEnv
from pollux.train.errors import (
    CheckpointError,
    EnvVarError,
    InvalidValueError,
    Preempted,
    TrainError,
    UsageError,
)
from pollux.train.gns import (
    AdamPreconditioner,
    GradientCollector,
    GradientNoiseScale,
    GradStats,
    adascale_gain,
    estimate,
)
from pollux.train.metrics import (
    InMemorySink,
    MetricsBatch,
    MetricsReporter,
    MetricsSink,
    StepObservation,
    StepProfile,
    WorkStatus,
)
from pollux.train.scaling import ScaledOptimizer, ScalingRule, lr_factor
from pollux.train.trainer import ElasticTrainer, Stateful, default_device, init, shutdown

__all__ = [
    "AdamPreconditioner",
    "AdaptiveDataLoader",
    "BatchConfig",
    "BatchConfigSource",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointManager",
    "ControlConfig",
    "DataConfig",
    "ElasticTrainer",
    "EnvVarError",
    "FixedBatchConfig",
    "GradStats",
    "GradientCollector",
    "GradientNoiseScale",
    "InMemorySink",
    "InvalidValueError",
    "MeasureConfig",
    "MetricsBatch",
    "MetricsReporter",
    "MetricsSink",
    "MicroBatchInfo",
    "Preempted",
    "ScaledOptimizer",
    "ScalingRule",
    "Stateful",
    "StepObservation",
    "StepPlan",
    "StepProfile",
    "StopSignal",
    "TrainEnv",
    "TrainError",
    "UsageError",
    "WorkStatus",
    "adascale_gain",
    "default_batch_config",
    "default_device",
    "estimate",
    "init",
    "lr_factor",
    "plan_step",
    "shutdown",
]
