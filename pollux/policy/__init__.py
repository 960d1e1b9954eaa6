"""Cluster policies: pure functions from a cluster snapshot to every job's allocation."""

from pollux.policy.params import PolicyInputError
from pollux.policy.types import (
    Allocation,
    AllocationDecision,
    ClusterState,
    JobExplain,
    JobInfo,
    NodeInfo,
    OracleInfo,
    Policy,
    TenantSpec,
)

__all__ = [
    "Allocation",
    "AllocationDecision",
    "ClusterState",
    "JobExplain",
    "JobInfo",
    "NodeInfo",
    "OracleInfo",
    "Policy",
    "PolicyInputError",
    "TenantSpec",
]
