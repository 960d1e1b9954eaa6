"""What one user, one tenant and one replica may hold of a scheduler: streams, queue, rate.

Every person is a possible attacker of every other: one who opens hundreds of streams or
submits thousands of jobs must hit a clear limit, not slow the replica down for everyone.
`LimitsConfig` is the ``[limits]`` table of the scheduler's configuration; the checks here are
pure (a `TokenBucket` per user and per tenant, counts passed in), and each refusal is a
`ResourceExhausted` whose message names the limit, its value and its setting. Admins are not
subject to the queue and rate limits (they operate the cluster); every authenticated principal
is subject to the stream limits (pollux.service.streams).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pollux.service.errors import ResourceExhausted

SECTION = "limits"
"""The configuration table these settings live in (messages name ``limits.<field>``)."""
MAX_BUCKETS = 100_000
"""Rate buckets kept per replica before full ones are dropped (a full bucket is a new one)."""


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """Per-principal bounds of one scheduler replica (0 turns a limit off)."""

    streams_per_principal: int = 32
    """Open streams (WatchJobs, StreamLogs, so `submit --follow` and `logs -f`) one
    authenticated principal may hold on one replica; past it RESOURCE_EXHAUSTED. Without TLS
    every caller is the one local admin, and only `streams_per_replica` applies."""
    streams_per_replica: int = 1024
    """Open streams of everyone together on one replica."""
    pending_jobs_per_user: int = 200
    """PENDING jobs one user may have in the cluster; a submit past it is refused."""
    pending_jobs_per_tenant: int = 1000
    """PENDING jobs the users of one tenant (the default tenant too) may have together."""
    submits_per_s_per_user: float = 5.0
    """Sustained submits per second one user may make on one replica (a token bucket)."""
    submit_burst_per_user: int = 50
    """Submits one user may make at once before `submits_per_s_per_user` applies."""
    submits_per_s_per_tenant: float = 20.0
    """Sustained submits per second of one tenant's users together on one replica."""
    submit_burst_per_tenant: int = 200
    """Submits one tenant's users may make at once before its rate applies."""

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem"."""
        out = []
        for name in (
            "streams_per_principal",
            "streams_per_replica",
            "pending_jobs_per_user",
            "pending_jobs_per_tenant",
            "submit_burst_per_user",
            "submit_burst_per_tenant",
        ):
            if getattr(self, name) < 0:
                out.append(f"{name}: must be >= 0 (0 = no limit)")
        for rate, burst in (
            ("submits_per_s_per_user", "submit_burst_per_user"),
            ("submits_per_s_per_tenant", "submit_burst_per_tenant"),
        ):
            if getattr(self, rate) < 0:
                out.append(f"{rate}: must be >= 0 (0 = no limit)")
            elif getattr(self, rate) > 0 and getattr(self, burst) < 1:
                out.append(f"{burst}: must be >= 1 while {rate} limits submits")
        return out


@dataclass(slots=True)
class TokenBucket:
    """`burst` tokens refilled at `rate` per second; a submit takes one."""

    rate: float
    burst: int
    tokens: float
    at: float

    def take(self, now: float) -> float:
        """Take a token: 0.0 if one was there, else the seconds until one will be (none taken)."""
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


def _tenant_name(tenant: str) -> str:
    return f"tenant {tenant!r}" if tenant else "the default tenant"


@dataclass
class SubmitLimits:
    """The queue and rate checks of SubmitJob on one replica.

    Args:
        config: The limits.
        clock: Monotonic seconds (the buckets' time).
    """

    config: LimitsConfig
    clock: Callable[[], float]
    _buckets: dict[tuple[str, str], TokenBucket] = field(default_factory=dict)

    def check_queue(self, user: str, tenant: str, pending_user: int, pending_tenant: int) -> None:
        """Refuse a submit that would take the user or tenant past its PENDING limit.

        Raises:
            ResourceExhausted: Naming the limit, its value and its setting.
        """
        c = self.config
        if c.pending_jobs_per_user and pending_user >= c.pending_jobs_per_user:
            raise ResourceExhausted(
                f"{user} has {pending_user} PENDING jobs, the most one user may have "
                f"({SECTION}.pending_jobs_per_user = {c.pending_jobs_per_user}): wait for some "
                "to start or cancel some (pollux-cli ls --state pending), then submit again"
            )
        if c.pending_jobs_per_tenant and pending_tenant >= c.pending_jobs_per_tenant:
            raise ResourceExhausted(
                f"{_tenant_name(tenant)} has {pending_tenant} PENDING jobs, the most one tenant "
                f"may have ({SECTION}.pending_jobs_per_tenant = {c.pending_jobs_per_tenant}): "
                "wait for some of its jobs to start, then submit again"
            )

    def take(self, user: str, tenant: str) -> None:
        """Take a submit from the user's and the tenant's buckets, or refuse it.

        The user's bucket is checked first; a refusal takes nothing from either.

        Raises:
            ResourceExhausted: Naming the rate, its burst and their settings.
        """
        c = self.config
        now = self.clock()
        checks = (
            (("user", user), c.submits_per_s_per_user, c.submit_burst_per_user),
            (("tenant", tenant), c.submits_per_s_per_tenant, c.submit_burst_per_tenant),
        )
        taken: list[TokenBucket] = []
        for key, rate, burst in checks:
            if rate <= 0:
                continue
            bucket = self._bucket(key, rate, burst, now)
            wait = bucket.take(now)
            if wait > 0:
                for back in taken:
                    back.tokens += 1.0
                who = user if key[0] == "user" else _tenant_name(tenant)
                retry = max(wait, 0.1)
                raise ResourceExhausted(
                    f"{who} submitted faster than {rate:g} jobs/s after a burst of {burst} "
                    f"({SECTION}.submits_per_s_per_{key[0]}, {SECTION}.submit_burst_per_"
                    f"{key[0]}): retry in {retry:.1f} s",
                    retry_after_s=retry,
                )
            taken.append(bucket)

    def _bucket(self, key: tuple[str, str], rate: float, burst: int, now: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._drop_full(now)
            bucket = self._buckets[key] = TokenBucket(rate, burst, float(burst), now)
        return bucket

    def _drop_full(self, now: float) -> None:
        """Forget buckets that have refilled: they are the same as new ones."""
        self._buckets = {
            k: b for k, b in self._buckets.items() if b.tokens + (now - b.at) * b.rate < b.burst
        }
