"""Rank 0's view of the batch source: the configuration it would propose to the replicas.

The leader asks the source (the job's agent, or a user's `BatchConfigSource`) at most once per
poll interval and keeps the latest answer; the replicas adopt it only through an agreement, so
every replica switches at the same step. A source that fails or answers nothing leaves the
proposal as it was: the control plane can be down without stopping training.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from structlog.typing import FilteringBoundLogger

from pollux.train.data import BatchConfig, BatchConfigSource
from pollux.train.errors import InvalidValueError


class ConfigPoller:
    """Polls a batch source on rank 0 for the shape the job runs in.

    Args:
        source: Where configurations come from; None: never any proposal.
        rank: This replica's rank; only rank 0 polls.
        num_nodes: Nodes N of the allocation (what the source is asked about).
        num_replicas: Replicas K of the allocation.
        interval_s: Least seconds between two queries of the source.
        clock: Monotonic seconds (injectable for tests).
        log: Where a failing source is logged.
    """

    def __init__(
        self,
        source: BatchConfigSource | None,
        *,
        rank: int,
        num_nodes: int,
        num_replicas: int,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        log: FilteringBoundLogger | None = None,
    ) -> None:
        if not interval_s >= 0:
            raise InvalidValueError("config_poll_interval_s", "must be ≥ 0")
        self.source = source
        self.rank = rank
        self.num_nodes = num_nodes
        self.num_replicas = num_replicas
        self.interval_s = interval_s
        self._clock = clock
        self._log = log if log is not None else structlog.get_logger(__name__)
        self._next_poll = 0.0
        self._proposal: BatchConfig | None = None

    @property
    def polls(self) -> bool:
        """Whether this replica polls at all (rank 0 with a source)."""
        return self.rank == 0 and self.source is not None

    def proposal(self) -> BatchConfig | None:
        """The latest configuration the source gave, polling first if the interval passed.

        None on every replica but rank 0, and before the source ever answered.
        """
        if not self.polls:
            return None
        now = self._clock()
        if now >= self._next_poll:
            self._next_poll = now + self.interval_s
            self._poll()
        return self._proposal

    def initial(
        self, restored: BatchConfig | None, from_leader: Callable[[Any], Any]
    ) -> BatchConfig | None:
        """The configuration to start with: rank 0's fresh answer, else `restored`.

        A collective when K > 1: `from_leader` hands rank 0's choice to every replica.
        """
        config = restored
        if self.polls:
            self._next_poll = self._clock() + self.interval_s
            if self._poll():
                config = self._proposal
        shared = from_leader(None if config is None else config.as_dict())
        return None if shared is None else BatchConfig.from_dict(shared)

    def _poll(self) -> bool:
        """Ask the source once; True when it answered with a configuration."""
        assert self.source is not None
        try:
            polled = self.source.batch_config(
                num_nodes=self.num_nodes, num_replicas=self.num_replicas
            )
        except Exception as exc:  # a failing source must not stop training
            self._log.warning("batch_config_unavailable", error=repr(exc))
            return False
        if polled is None:
            return False
        self._proposal = polled
        return True
