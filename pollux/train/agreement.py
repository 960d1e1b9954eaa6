"""What the replicas agree on at the end of a step, as a few floats that one all-reduce carries.

With several replicas a step ends now and then in an *agreement* (`pollux.train.trainer`): one
small SUM all-reduce of every replica's stop flag, the leader's (rank 0's) batch configuration
and its choice of when to agree next, followed by a measured step's local gradient norms. This
module is the control part of that buffer, kept free of torch so that its encoding and merge
rule are tested without a process group; the trainer does the collective.

Summing the encodings is `combine`: the stop flags sum to a positive count if any replica asks
to stop, and only the leader proposes a configuration and a schedule (the followers send
zeros), so those fields sum to the leader's values. Every number is an integer or a float64 as
proposed, so the sum is exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from pollux.train.data import BatchConfig
from pollux.train.errors import InvalidValueError


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
        if isinstance(self.next_in, bool) or not isinstance(self.next_in, int):
            raise InvalidValueError("next_in", f"must be an int, got {self.next_in!r}")
        if self.next_in < 0:
            raise InvalidValueError("next_in", f"must be ≥ 0, got {self.next_in}")

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
