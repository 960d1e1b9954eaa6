"""Tenants' shares of the cluster: the methods, one module each, behind one protocol.

With tenants in the round's state the Pollux policy asks its method (`TenantShares`) for a
first level (GPU budgets and a tenant factor of each job's weight), searches within it,
lets the method repair the result and remember what the next round needs. The methods:
"isolation" (the default: each tenant its sharing incentive, else single-pool Pollux),
"deficits" (shares met over time), "weights" (shares by weighted utility, one level) and
"budgets" (max-min fair GPU budgets in goodput, two levels). docs/configuration.md
(`scheduling.tenant_shares`) says when to choose which.
"""

from __future__ import annotations

from pollux.policy.tenant_shares.base import Division, TenantShares
from pollux.policy.tenant_shares.budgets import Budgets
from pollux.policy.tenant_shares.deficits import Deficits
from pollux.policy.tenant_shares.isolation import Isolation
from pollux.policy.tenant_shares.ledger import Ledger
from pollux.policy.tenant_shares.weights import Weights

METHODS: dict[str, TenantShares] = {
    method.name: method for method in (Isolation(), Deficits(), Weights(), Budgets())
}
"""Every tenant-share method by its setting name, the default first."""

DEFAULT = "isolation"
"""The method a fresh scheduler uses."""


def tenant_shares(name: str) -> TenantShares:
    """The method called `name`.

    Raises:
        ValueError: No method has that name (the message lists those that do).
    """
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(
            f"unknown tenant_shares {name!r}; choose one of {', '.join(METHODS)}"
        ) from None


__all__ = [
    "DEFAULT",
    "METHODS",
    "Budgets",
    "Deficits",
    "Division",
    "Isolation",
    "Ledger",
    "TenantShares",
    "Weights",
    "tenant_shares",
]
