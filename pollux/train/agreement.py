"""What the replicas agree on at the end of a step, as a few floats that one all-reduce carries.

With several replicas a step ends now and then in an *agreement*: one small SUM all-reduce of
every replica's stop flag, the leader's (rank 0's) batch configuration and its choice of when
to agree next, followed by a measured step's local gradient norms. `Agreement` is that
buffer's control part and its encoding, `AgreementSchedule` when the next agreement falls, and
`Agreements` one replica's side of the protocol; the collective itself is passed in, so all of
this is torch-free and tested without a process group.

Summing the encodings is `combine`: the stop flags sum to a positive count if any replica asks
to stop, and only the leader proposes a configuration and a schedule (the followers send
zeros), so those fields sum to the leader's values. Every number is an integer or a float64 as
proposed, so the sum is exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pollux import checks
from pollux.train.data import BatchConfig
from pollux.train.errors import InvalidValueError
from pollux.train.schedule import next_agreement_in


@dataclass(frozen=True, slots=True)
class Agreement:
    """One replica's proposal, or (after `combine`) what all replicas agreed on.

    Attributes:
        stop: A planned stop was requested (SIGTERM): checkpoint after this step and exit.
        config: The batch configuration for the next steps (the leader's proposal), or None
            for no change.
        next_in: Optimizer steps until the next agreement, the leader's choice; 0 from a
            follower, which has no say.
    """

    FIELDS: ClassVar[int] = 6
    """Length of the encoding: stop, has_config, local_bsz, accum_steps, lr_scale, next_in."""

    stop: bool = False
    config: BatchConfig | None = None
    next_in: int = 0

    def __post_init__(self) -> None:
        checks.whole_number(self.next_in, least=0, error=InvalidValueError.of("next_in"))

    @property
    def leads(self) -> bool:
        """Whether this proposal speaks for the leader (a configuration or a schedule)."""
        return self.config is not None or self.next_in != 0

    def encode(self) -> list[float]:
        """The `FIELDS` floats of this proposal; a lr_scale of None is sent as 0."""
        values = [1.0 if self.stop else 0.0, 0.0, 0.0, 0.0, 0.0, float(self.next_in)]
        config = self.config
        if config is not None:
            values[1:5] = [
                1.0,
                float(config.local_bsz),
                float(config.accum_steps),
                0.0 if config.lr_scale is None else config.lr_scale,
            ]
        return values

    @classmethod
    def decode(cls, values: Sequence[float]) -> Agreement:
        """Inverse of `encode`, also of a sum of encodings (see `combine`).

        Raises:
            InvalidValueError: `values` is not `FIELDS` long.
        """
        if len(values) != cls.FIELDS:
            raise InvalidValueError("values", f"needs {cls.FIELDS} floats, got {len(values)}")
        stop, has_config, local_bsz, accum_steps, lr_scale, next_in = values
        config = None
        if has_config >= 0.5:
            config = BatchConfig(
                local_bsz=round(local_bsz),
                accum_steps=round(accum_steps),
                lr_scale=None if lr_scale == 0.0 else lr_scale,
            )
        return cls(stop=stop > 0, config=config, next_in=round(next_in))


def combine(proposals: Iterable[Agreement]) -> Agreement:
    """What the replicas agree on: stop if any asks to; the leader's configuration and schedule.

    ``Agreement.decode`` of the element-wise sum of the proposals' encodings gives the same
    result, which is what the trainer's all-reduce computes.

    Raises:
        InvalidValueError: No proposals, or more than one leads (their sum would be nonsense).
    """
    proposals = list(proposals)
    if not proposals:
        raise InvalidValueError("proposals", "give at least one")
    leaders = [p for p in proposals if p.leads]
    if len(leaders) > 1:
        raise InvalidValueError("proposals", f"only the leader proposes; {len(leaders)} did")
    leader = leaders[0] if leaders else Agreement()
    return Agreement(
        stop=any(p.stop for p in proposals), config=leader.config, next_in=leader.next_in
    )


class AgreementSchedule:
    """When the replicas next agree: counted in steps, chosen by the leader from step times.

    Every replica keeps one and counts steps alike; after an agreement all of them adopt the
    leader's `Agreement.next_in`, so they stay in step without further communication.

    Args:
        period_s: The wanted seconds between agreements (`next_agreement_in`).
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(self, period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not period_s >= 0:
            raise InvalidValueError("agreement_period_s", "must be ≥ 0")
        self.period_s = period_s
        self._clock = clock
        self.until = 1
        """Steps until the next agreement, this one included (the first step agrees)."""
        self._since = 0
        self._started = clock()

    def step_finished(self) -> None:
        """Count a finished step that was not (yet) settled by an agreement."""
        self.until -= 1
        self._since += 1

    def next_in(self) -> int:
        """The leader's proposal: steps to the agreement after this one (`next_agreement_in`)."""
        return next_agreement_in(
            elapsed_s=self._clock() - self._started,
            steps_since_agreement=self._since,
            agreement_period_s=self.period_s,
        )

    def agreed(self, next_in: int) -> None:
        """An agreement settled the current step; the next is `next_in` steps away."""
        self.until = max(1, next_in)
        self._started = self._clock()
        self._since = 0


class PendingSum(Protocol):
    """A SUM all-reduce in flight (`pollux.train.distributed.PendingSum`)."""

    def result(self) -> list[float]:
        """The summed values, once every replica has contributed."""
        ...


class Agreements:
    """One replica's side of the agreements: its proposal, the agreed outcome, the schedule.

    Args:
        rank: This replica's rank; rank 0 leads.
        world_size: Replicas K; with one there is nothing to agree on, and `settle` gives the
            replica's own proposal after every step.
        schedule: When the replicas agree next.
        stop_requested: Whether this replica was asked to stop.
        proposal: The leader's latest batch configuration (`ConfigPoller.proposal`).
        start_sum: Starts the SUM all-reduce of the encoding followed by a tail (the local
            gradient norms, or None).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        schedule: AgreementSchedule,
        stop_requested: Callable[[], bool],
        proposal: Callable[[], BatchConfig | None],
        start_sum: Callable[[list[float], Any], PendingSum],
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.schedule = schedule
        self._stop_requested = stop_requested
        self._proposal = proposal
        self._start_sum = start_sum

    def start(self, tail: Any = None) -> PendingSum:
        """Send this replica's proposal (and `tail`) into the step's agreement all-reduce."""
        proposal = Agreement(stop=self._stop_requested())
        if self.rank == 0:
            proposal = Agreement(
                stop=proposal.stop, config=self._proposal(), next_in=self.schedule.next_in()
            )
        return self._start_sum(proposal.encode(), tail)

    def settle(self, pending: PendingSum | None) -> tuple[Agreement | None, list[float]]:
        """What the replicas agreed on at the end of this step, and the summed tail.

        Args:
            pending: The step's `start`, or None on a step without an agreement.

        Returns:
            The agreement (None on a step without one) and the sum of the replicas' tails.
        """
        if self.world_size == 1:
            return Agreement(stop=self._stop_requested(), config=self._proposal()), []
        self.schedule.step_finished()
        if pending is None:
            return None, []
        reduced = pending.result()
        agreed = Agreement.decode(reduced[: Agreement.FIELDS])
        self.schedule.agreed(agreed.next_in)
        return agreed, reduced[Agreement.FIELDS :]
