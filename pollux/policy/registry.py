"""The scheduling policies by name: one spec, parsed once, and the one `make_policy`.

The scheduler, the simulator, the forecasts and the benchmarks all build their policy here
from a `PolicySpec`: the policy's name (one of `POLICY_NAMES`) and its supported settings.
Everything a caller needs to know of the policy it gets is on the `Policy` protocol
(`pollux.policy.types`), so no caller compares names. Ablations (variants measured but not
supported, e.g. the jct mode without its rank weights) are built by benchmarks/ alone.
docs/configuration.md ("Scheduling policy") documents every name and setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.jct import JctParams, RestartRule
from pollux.policy.optimus import OptimusPolicy
from pollux.policy.params import PolluxParams
from pollux.policy.tenant_shares import METHODS, tenant_shares
from pollux.policy.tiresias import TiresiasPolicy
from pollux.policy.types import Policy


def _pollux(spec: PolicySpec, jct: JctParams | None = None) -> PolluxPolicy:
    params = PolluxParams(restart_delay=spec.restart_delay_s)
    return PolluxPolicy(params, jct=jct, tenant_shares=tenant_shares(spec.tenant_shares))


def _pollux_jct(spec: PolicySpec) -> PolluxPolicy:
    return _pollux(spec, JctParams(restart=cast(RestartRule, spec.jct_restart)))


_BUILDERS: dict[str, Callable[[PolicySpec], Policy[Any]]] = {
    "pollux-jct": _pollux_jct,
    "pollux": _pollux,
    "optimus": lambda _: OptimusPolicy(),
    "tiresias": lambda _: TiresiasPolicy(),
}

POLICY_NAMES = tuple(_BUILDERS)
"""Every policy a scheduler or a simulation may run, the default first:

- "pollux-jct": Pollux's goodput models with the jct objective (remaining-work weights,
  restart pricing over a move's lifetime; lower mean JCT at every measured load);
- "pollux": Pollux as published (OSDI'21), the paper's configuration;
- "optimus": Optimus+Oracle, the paper's baseline (GPU counts by marginal remaining time);
- "tiresias": Tiresias, the paper's baseline (two-queue least-attained-service, fixed sizes).
"""

DEFAULT_POLICY = POLICY_NAMES[0]
"""The policy of a fresh scheduler."""

JCT_RESTARTS: tuple[RestartRule, ...] = ("ramp", "holding", "expected")
"""The supported restart rules of "pollux-jct" (`JctParams.restart`), the default first."""

TENANT_SHARES = tuple(METHODS)
"""The tenant-share methods of the Pollux policies, the default first."""

_TAKES = {
    "jct_restart": ("pollux-jct",),
    "tenant_shares": ("pollux-jct", "pollux"),
}
"""The policies each non-default setting applies to."""


class PolicySpecError(ValueError):
    """A policy spec no policy matches; the message says what to choose instead.

    Attributes:
        problems: Every problem, as "field: problem".
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A scheduling policy as configured: its name and its settings.

    Attributes:
        name: One of `POLICY_NAMES`.
        restart_delay_s: Seconds a re-allocation is expected to cost, for the Pollux
            policies' restart penalty (a job that measured its own pause uses that in the
            jct mode); ≥ 0.
        jct_restart: Of "pollux-jct": how a move's lifetime is taken when its restart pause
            is priced, one of `JCT_RESTARTS`.
        tenant_shares: Of the Pollux policies: how busy tenants get their shares, one of
            `TENANT_SHARES` (only with tenants).

    Raises:
        PolicySpecError: A field is invalid (every problem, with the valid choices).
    """

    name: str = DEFAULT_POLICY
    restart_delay_s: float = 30.0
    jct_restart: str = JCT_RESTARTS[0]
    tenant_shares: str = TENANT_SHARES[0]

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise PolicySpecError(problems)

    @classmethod
    def parse(cls, name: str, **settings: Any) -> PolicySpec:
        """The spec of policy `name` with `settings` (field names of this class).

        Raises:
            PolicySpecError: An unknown setting, or an invalid name or value.
        """
        unknown = sorted(set(settings) - set(cls.__dataclass_fields__) - {"name"})
        if unknown:
            known = ", ".join(f for f in cls.__dataclass_fields__ if f != "name")
            raise PolicySpecError(
                [f"{u}: unknown policy setting (known: {known})" for u in unknown]
            )
        return cls(name=name, **settings)

    def problems(self) -> list[str]:
        """Every invalid field, as "field: problem" (empty when the spec is valid)."""
        out = []
        if self.name not in POLICY_NAMES:
            out.append(f"policy: {self.name!r} is not one of {', '.join(POLICY_NAMES)}")
        if not self.restart_delay_s >= 0:
            out.append(f"restart_delay_s: must be >= 0, got {self.restart_delay_s}")
        if self.jct_restart not in JCT_RESTARTS:
            out.append(f"jct_restart: {self.jct_restart!r} is not one of {', '.join(JCT_RESTARTS)}")
        if self.tenant_shares not in TENANT_SHARES:
            out.append(
                f"tenant_shares: {self.tenant_shares!r} is not one of {', '.join(TENANT_SHARES)}"
            )
        defaults = PolicySpec.__dataclass_fields__
        for setting, policies in _TAKES.items():
            changed = getattr(self, setting) != defaults[setting].default
            if changed and self.name in POLICY_NAMES and self.name not in policies:
                out.append(
                    f"{setting}: applies to {' and '.join(policies)} only, not to {self.name}"
                )
        return out


def make_policy(spec: PolicySpec) -> Policy[Any]:
    """The policy `spec` names, with its settings."""
    return _BUILDERS[spec.name](spec)
