"""The Pollux policy: constraints, penalty, fairness, stability; the NSGA-II baseline too."""

from collections import Counter

import numpy as np
import pytest

from benchmarks.nsga2 import NsgaConfig, NsgaPolicy
from pollux.policy import ClusterState, JobInfo, PolicyInputError
from pollux.policy.goodput_policy import PolluxParams, PolluxPolicy
from pollux.policy.params import Normalisation
from pollux.policy.valuation import restart_factor
from tests.unit.policy_builders import job, nodes, random_state, state

RNG = np.random.default_rng(0)
GREEDY = PolluxPolicy()
NSGA = NsgaPolicy(config=NsgaConfig(population=20, generations=10))


def distributed_per_node(decision, cluster_state: ClusterState) -> Counter[str]:
    count: Counter[str] = Counter()
    for alloc in decision.allocations.values():
        if len(set(alloc)) > 1:
            count.update(set(alloc))
    return count


@pytest.mark.parametrize("policy", [GREEDY, NSGA], ids=["greedy", "nsga2"])
@pytest.mark.parametrize("seed", range(6))
def test_every_constraint_holds_on_random_clusters(policy, seed):
    st = random_state(np.random.default_rng(seed))
    decision = policy.allocate(st, None, np.random.default_rng(seed))
    assert set(decision.allocations) == set(decision.explain) == {j.name for j in st.jobs}
    used = Counter(n for alloc in decision.allocations.values() for n in alloc)
    capacity = {n.name: n.gpus for n in st.nodes}
    assert all(used[n] <= capacity[n] for n in used), "a node is over capacity"
    assert max(distributed_per_node(decision, st).values(), default=0) <= 1
    order = [n.name for n in st.nodes]
    for j in st.jobs:
        alloc = decision.allocations[j.name]
        assert len(alloc) <= j.max_replicas
        assert list(alloc) == sorted(alloc, key=order.index), "allocation not canonical"
        assert len(set(alloc)) <= 16


def test_every_job_gets_a_gpu_when_there_are_enough():
    cluster = nodes(4)
    jobs = [job(f"j{i}", max_replicas=16) for i in range(10)]
    decision = GREEDY.allocate(state(jobs, cluster), None, RNG)
    assert all(len(a) >= 1 for a in decision.allocations.values())
    assert sum(len(a) for a in decision.allocations.values()) == 16


def test_max_nodes_per_job_caps_how_far_a_job_spreads():
    policy = PolluxPolicy(PolluxParams(max_nodes_per_job=2))
    decision = policy.allocate(state([job("big", max_replicas=32)], nodes(8)), None, RNG)
    assert len(set(decision.allocations["big"])) <= 2


def test_interference_avoidance_can_be_switched_off():
    # Two jobs that each want 6 GPUs on 3 nodes: with avoidance they cannot share a node.
    jobs = [job("a", max_replicas=6), job("b", max_replicas=6)]
    decision = PolluxPolicy().allocate(state(jobs, nodes(3)), None, RNG)
    assert max(distributed_per_node(decision, None).values(), default=0) <= 1
    free_for_all = PolluxPolicy(PolluxParams(interference_avoidance=False))
    shared = free_for_all.allocate(state(jobs, nodes(3)), None, RNG)
    assert sum(len(a) for a in shared.allocations.values()) == 12


def test_min_replicas_is_all_or_nothing():
    jobs = [job("gang", min_replicas=6, max_replicas=8), job("small", max_replicas=4)]
    decision = GREEDY.allocate(state(jobs, nodes(2)), None, RNG)
    assert len(decision.allocations["gang"]) in (0, *range(6, 9))


def test_unchanged_jobs_carry_no_penalty_and_changed_ones_the_restart_factor():
    running = job("run", on=("n0",) * 4, age=600, restarts=2, max_replicas=4)
    newcomer = job("new", age=60, max_replicas=4)
    decision = GREEDY.allocate(state([running, newcomer], nodes(2)), None, RNG)
    assert decision.allocations["run"] == ("n0",) * 4
    assert decision.explain["run"].penalty == 1.0
    assert decision.explain["run"].reason.startswith("unchanged")
    assert decision.explain["new"].penalty == pytest.approx(restart_factor(60, 0, 30.0))
    assert decision.explain["new"].reason.startswith("started")


def test_a_young_job_is_not_moved_for_a_marginal_gain():
    # Spread over two nodes a 4-GPU job is slightly slower than on one; moving it would
    # gain a little speedup but cost a restart worth a third of its life so far.
    young = job("young", on=("n0", "n0", "n1", "n1"), age=90, restarts=1, max_replicas=4)
    decision = GREEDY.allocate(state([young], nodes(2)), None, RNG)
    assert decision.allocations["young"] == ("n0", "n0", "n1", "n1")


def test_an_old_job_is_consolidated_when_spreading_costs_a_lot():
    slow_net = job("old", on=("n0", "n0", "n1", "n1"), age=36000, restarts=1, max_replicas=4)
    decision = GREEDY.allocate(state([slow_net], nodes(2)), None, RNG)
    assert len(set(decision.allocations["old"])) == 1


def test_jobs_without_a_model_are_assumed_to_scale_linearly():
    decision = GREEDY.allocate(
        state([job("fresh", noise=None, max_replicas=4)], nodes(1)), None, RNG
    )
    assert len(decision.allocations["fresh"]) == 4


@pytest.mark.parametrize("seed", range(12))
def test_the_power_mean_exponent_trades_fairness_for_throughput(seed):
    # p = 1 maximises total speedup, p = -1 the harmonic mean: each must win on its own.
    st = random_state(np.random.default_rng(seed))
    results = {}
    for p in (1.0, -1.0):
        params = PolluxParams(p=p, normalisation=Normalisation.ONE_GPU, restart_delay=0.0)
        decision = PolluxPolicy(params).allocate(st, None, RNG)
        speedups = np.array([decision.explain[j.name].speedup for j in st.jobs]) + 1e-3
        results[p] = (speedups.sum(), len(speedups) / np.sum(1 / speedups))
    assert results[1.0][0] >= results[-1.0][0] - 1e-9
    assert results[-1.0][1] >= results[1.0][1] - 1e-9


@pytest.mark.parametrize("seed", range(5))
def test_feeding_a_decision_back_changes_nothing(seed):
    st = random_state(np.random.default_rng(100 + seed))
    first = GREEDY.allocate(st, None, RNG)
    again = state(
        [
            JobInfo(
                name=j.name,
                submission_time=j.submission_time,
                allocation=first.allocations[j.name],
                restarts=j.restarts
                + int(bool(j.allocation) and first.allocations[j.name] != j.allocation),
                max_replicas=j.max_replicas,
                model=j.model,
            )
            for j in st.jobs
        ],
        st.nodes,
        now=st.now + 60,
    )
    second = GREEDY.allocate(again, None, RNG)
    assert second.allocations == first.allocations


def test_greedy_is_deterministic_and_nsga2_is_reproducible_per_seed():
    st = random_state(np.random.default_rng(7))
    assert GREEDY.allocate(st, None, RNG).allocations == GREEDY.allocate(st, None, RNG).allocations
    a = NSGA.allocate(st, None, np.random.default_rng(1))
    b = NSGA.allocate(st, None, np.random.default_rng(1))
    assert a.allocations == b.allocations
    assert a.memory is not None


def test_greedy_objective_is_at_least_the_current_allocations():
    st = random_state(np.random.default_rng(11))
    keep = NsgaPolicy(config=NsgaConfig(population=1, generations=1))
    baseline = keep.allocate(st, None, RNG).objective  # the (repaired) current allocation
    assert GREEDY.allocate(st, None, RNG).objective >= baseline


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"p": float("nan")}, "params.p"),
        ({"restart_delay": -1.0}, "params.restart_delay"),
        ({"max_nodes_per_job": 0}, "params.max_nodes_per_job"),
        ({"epsilon": 0.0}, "params.epsilon"),
    ],
    ids=["NaN exponent", "negative delay", "zero node cap", "zero epsilon"],
)
def test_bad_parameters_are_rejected(bad, field):
    with pytest.raises(PolicyInputError) as err:
        PolluxParams(**bad)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("jobs", "field"),
    [
        ([job("a", on=("n9",))], "jobs[a].allocation"),
        ([job("a"), job("a")], "jobs"),
        ([job("a", on=("n0",) * 5)], "nodes[n0]"),
        ([job("a", min_replicas=4, max_replicas=2)], "jobs[a].max_replicas"),
    ],
    ids=["unknown node", "duplicate job", "over capacity", "min above max"],
)
def test_states_a_policy_cannot_act_on_are_rejected(jobs, field):
    with pytest.raises(PolicyInputError) as err:
        GREEDY.allocate(state(jobs, nodes(2)), None, RNG)
    assert err.value.field == field


def test_empty_cluster_state_gives_an_empty_decision():
    decision = GREEDY.allocate(state([], nodes(2)), None, RNG)
    assert decision.allocations == {}


def test_a_current_allocation_beyond_todays_caps_is_valued_and_brought_within_them():
    # The job runs on 6 nodes, within its 8 replicas, but the node cap is now 2.
    wide = job("wide", on=tuple(f"n{i}" for i in range(6)), max_replicas=8)
    policy = PolluxPolicy(PolluxParams(max_nodes_per_job=2))
    decision = policy.allocate(state([wide], nodes(6)), None, RNG)
    alloc = decision.allocations["wide"]
    assert 0 < len(alloc) <= 8
    assert len(set(alloc)) <= 2


def test_a_shrink_names_the_job_that_took_the_gpus_and_what_it_gained():
    # An old job holds the whole node; two new jobs arrive that gain far more per GPU.
    hog = job("hog", on=("n0",) * 4, age=36000, max_replicas=4, noise=1.0)
    new = [job(f"new{i}", age=600, max_replicas=2) for i in range(2)]
    decision = GREEDY.allocate(state([hog, *new], nodes(1)), None, RNG)
    kept = len(decision.allocations["hog"])
    assert kept < 4
    reason = decision.explain["hog"].reason
    takers = [n for n in ("new0", "new1") if decision.allocations[n]]
    assert takers, decision.allocations
    assert "its GPUs went to " in reason
    for name in takers:
        assert f"{name} (0 → " in reason
    # The speedups of the taker (from 0: it had no GPU) and of the job that shrank.
    taker = reason.split(f"{takers[0]} (0 → ", 1)[1]
    assert float(taker.split("speedup 0 → ", 1)[1].split(")")[0]) > 0
    own_before, own_after = reason.rsplit("its speedup ", 1)[1].split(" → ")
    assert float(own_before) > float(own_after) > 0
    # A job that grew or stayed says nothing of takers.
    assert all("went to" not in decision.explain[n].reason for n in ("new0", "new1"))
