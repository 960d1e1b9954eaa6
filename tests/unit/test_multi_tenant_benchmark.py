"""The multi-tenant benchmark's measures (benchmarks/multi_tenant.py): labels, busy rounds."""

import numpy as np
import pytest

from benchmarks.multi_tenant import CONFIGS, Round, _entitled, _labelled, shares
from pollux.policy.types import TenantSpec
from pollux.sim.traces import default_data_root

WORKLOADS = sorted((default_data_root() / "workloads").glob("*.csv"))


@pytest.mark.parametrize("config", ["4 weights 1:1:2:4", "3 one guaranteed 24"])
def test_entitled_demand_gives_tenants_jobs_in_proportion_to_their_entitlement(config: str) -> None:
    specs = CONFIGS[config]
    entitled = _entitled(specs, 64)
    counts = {"equal": np.zeros(len(specs)), "entitled": np.zeros(len(specs))}
    for path in WORKLOADS:
        for demand, tally in counts.items():
            for job in _labelled(path, specs, "hash", demand):  # type: ignore[arg-type]
                tally[[t.name for t in specs].index(job.tenant)] += 1
    jobs = counts["entitled"].sum()
    assert jobs == 8 * 160
    # within one job per workload
    assert np.abs(counts["entitled"] / jobs - entitled / entitled.sum()).max() <= 8 / jobs
    assert np.abs(counts["equal"] / jobs - 1 / len(specs)).max() < 0.04


def test_shares_count_only_rounds_in_which_every_tenant_has_unmet_demand() -> None:
    specs = (TenantSpec("a"), TenantSpec("b"))
    tenant_of = {"a1": "a", "a2": "a", "b1": "b"}
    config = "two"
    rounds: list[Round] = [
        # all busy: a holds 3 (wants 6), b holds 1 (wants 2)
        ((("a1", 2.0, 2, 4), ("a2", 1.0, 1, 2), ("b1", 1.0, 1, 2)), {config: [3.0, 2.0]}),
        # b has all it can use: not counted, whatever the shares
        ((("a1", 4.0, 4, 8), ("b1", 0.5, 2, 2)), {config: [4.0, 4.0]}),
        # all busy again
        ((("a1", 1.0, 1, 2), ("b1", 3.0, 3, 6)), {config: [2.0, 2.0]}),
    ]
    measured = shares([(rounds, tenant_of)], specs, config)
    assert (measured.busy_rounds, measured.rounds) == (2, 3)
    np.testing.assert_allclose(measured.goodput, [(0.75 + 0.25) / 2, (0.25 + 0.75) / 2])
    np.testing.assert_allclose(measured.gpus, [(0.75 + 0.25) / 2, (0.25 + 0.75) / 2])
    # goodput ÷ isolated goodput, each summed over the busy rounds
    np.testing.assert_allclose(measured.isolated, [4.0 / 5.0, 4.0 / 4.0])
    # a got 1.0 < 0.9 × 2.0 in the third round; b 1.0 < 0.9 × 2.0 in the first
    np.testing.assert_allclose(measured.below, [0.5, 0.5])


def test_shares_without_a_busy_round_are_not_a_number() -> None:
    specs = (TenantSpec("a"), TenantSpec("b"))
    rounds: list[Round] = [((("a1", 1.0, 1, 1),), {"c": [1.0, 1.0]})]
    measured = shares([(rounds, {"a1": "a"})], specs, "c")
    assert (measured.busy_rounds, measured.rounds) == (0, 1)
    assert np.isnan(measured.goodput).all()
