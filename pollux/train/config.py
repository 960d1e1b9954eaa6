"""The trainer's settings, one frozen group per part of the trainer that reads it.

`ElasticTrainer` takes a `DataConfig` (the loader), a `CheckpointConfig` (where and how often
to checkpoint), a `MeasureConfig` (the gradient statistics, step timing and reports) and a
`ControlConfig` (the agent, the batch-size poll, the replicas' agreement, SIGTERM). The groups
check their values when built, so a bad value fails on every replica before the first
collective. The flat keywords of earlier versions (``shuffle=...``, ``checkpoint_dir=...``)
are still accepted and map onto these groups (`with_keywords`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset

from pollux import checks
from pollux.train.data import AdaptiveDataLoader, BatchConfig
from pollux.train.errors import InvalidValueError

DEFAULT_CHECKPOINT_INTERVAL_S = 300.0
"""Periodic checkpoint interval unless the job says otherwise: a crash loses minutes, not the
whole allocation's training, and a save every few minutes costs little next to it."""


@dataclass(frozen=True, slots=True)
class DataConfig:
    """How the trainer's loader serves the dataset (checked by `AdaptiveDataLoader`).

    Attributes:
        shuffle: Shuffle a map-style dataset each epoch (the same order on every replica).
        seed: Seed of the data order.
        collate_fn: Batch builder; default: torch's.
        num_workers: Loader worker processes (0: load in the training process).
        pin_memory: Pin host batches (CUDA).
    """

    shuffle: bool = True
    seed: int = 0
    collate_fn: Callable[[list[Any]], Any] | None = None
    num_workers: int = 0
    pin_memory: bool = False

    def loader(
        self,
        dataset: Dataset[Any] | IterableDataset[Any],
        batch_config: BatchConfig,
        *,
        rank: int,
        num_replicas: int,
        device: torch.device | None,
    ) -> AdaptiveDataLoader:
        """A loader of `dataset` for replica `rank` of `num_replicas` with these settings."""
        return AdaptiveDataLoader(
            dataset,
            batch_config,
            rank=rank,
            num_replicas=num_replicas,
            shuffle=self.shuffle,
            seed=self.seed,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            device=device,
        )


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """Where and when the trainer checkpoints.

    Attributes:
        directory: The checkpoint directory; default ``POLLUX_CHECKPOINT_DIR``.
        enabled: False disables checkpoints even when a directory is configured.
        interval_s: Also checkpoint at the first step boundary after this many seconds, so
            that a crash (of the replica, its node or its launcher) loses at most this much
            training; None: only on a stop and at the end.
    """

    directory: Path | str | None = None
    enabled: bool = True
    interval_s: float | None = DEFAULT_CHECKPOINT_INTERVAL_S

    def __post_init__(self) -> None:
        if self.interval_s is not None and not self.interval_s > 0:
            raise InvalidValueError("checkpoint_interval_s", "must be > 0 or None")


@dataclass(frozen=True, slots=True)
class MeasureConfig:
    """What the trainer measures for the scheduler, and how often it reports.

    Attributes:
        stats_interval: Measure the gradient statistics once per this many M0-batches of
            samples (≥ 1), i.e. every ``max(1, round(stats_interval · M0 / M))`` optimizer
            steps; 1 at M = M0 is the published every-step scheme.
        profile_warmup_steps: Optimizer steps not timed after a start or a configuration
            change (allocator and autotuner warm-up).
        report_interval_s: Seconds between metric reports (rank 0).
    """

    stats_interval: int = 8
    profile_warmup_steps: int = 1
    report_interval_s: float = 5.0

    def __post_init__(self) -> None:
        checks.whole_number(
            self.stats_interval, least=1, error=InvalidValueError.of("stats_interval")
        )
        checks.whole_number(
            self.profile_warmup_steps, least=0, error=InvalidValueError.of("profile_warmup_steps")
        )
        if not self.report_interval_s > 0:
            raise InvalidValueError(
                "report_interval_s", f"must be > 0, got {self.report_interval_s}"
            )


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """How the job is steered: its agent, the batch-size poll, the agreement, SIGTERM.

    Attributes:
        connect_agent: False never connects to the job's agent, even with
            ``POLLUX_AGENT_ADDR`` set; otherwise the agent serves as whichever of the batch
            source and the metrics sink the trainer was not given.
        handle_sigterm: Install the SIGTERM handler (main thread only).
        config_poll_interval_s: Seconds between queries of the batch source (rank 0).
        agreement_period_s: With several replicas, the replicas agree on stop and batch
            configuration (one small all-reduce) whenever statistics are measured and, when
            steps are slow, about this often: a stop never waits much longer than this or
            one step.
    """

    connect_agent: bool = True
    handle_sigterm: bool = True
    config_poll_interval_s: float = 5.0
    agreement_period_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.config_poll_interval_s >= 0:
            raise InvalidValueError("config_poll_interval_s", "must be ≥ 0")
        if not self.agreement_period_s >= 0:
            raise InvalidValueError("agreement_period_s", "must be ≥ 0")


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    """The four groups together, as the trainer holds them."""

    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    control: ControlConfig = field(default_factory=ControlConfig)

    @classmethod
    def of(
        cls,
        data: DataConfig | None = None,
        checkpoint: CheckpointConfig | None = None,
        measure: MeasureConfig | None = None,
        control: ControlConfig | None = None,
    ) -> TrainerConfig:
        """The groups given, the defaults for those that are None."""
        return cls(
            data or DataConfig(),
            checkpoint or CheckpointConfig(),
            measure or MeasureConfig(),
            control or ControlConfig(),
        )


KEYWORDS: Mapping[str, tuple[str, str]] = {
    "shuffle": ("data", "shuffle"),
    "seed": ("data", "seed"),
    "collate_fn": ("data", "collate_fn"),
    "num_workers": ("data", "num_workers"),
    "pin_memory": ("data", "pin_memory"),
    "checkpoint_dir": ("checkpoint", "directory"),
    "checkpointing": ("checkpoint", "enabled"),
    "checkpoint_interval_s": ("checkpoint", "interval_s"),
    "stats_interval": ("measure", "stats_interval"),
    "profile_warmup_steps": ("measure", "profile_warmup_steps"),
    "report_interval_s": ("measure", "report_interval_s"),
    "connect_agent": ("control", "connect_agent"),
    "handle_sigterm": ("control", "handle_sigterm"),
    "config_poll_interval_s": ("control", "config_poll_interval_s"),
    "agreement_period_s": ("control", "agreement_period_s"),
}
"""The trainer's flat keywords of earlier versions: keyword → (group, field)."""


def with_keywords(config: TrainerConfig, keywords: Mapping[str, Any]) -> TrainerConfig:
    """`config` with the flat `keywords` applied over its groups' fields.

    Raises:
        TypeError: A keyword is not one of `KEYWORDS` (as for any unknown argument).
        InvalidValueError: A value is out of range (the group's own check).
    """
    unknown = sorted(set(keywords) - set(KEYWORDS))
    if unknown:
        raise TypeError(f"ElasticTrainer() got unexpected keyword arguments: {unknown}")
    changes: dict[str, dict[str, Any]] = {}
    for keyword, value in keywords.items():
        group, name = KEYWORDS[keyword]
        changes.setdefault(group, {})[name] = value
    updated = {
        group: dataclasses.replace(getattr(config, group), **fields)
        for group, fields in changes.items()
    }
    return dataclasses.replace(config, **updated)
