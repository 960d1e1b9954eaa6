"""The Pollux policies on several GPU types: constraints, placement, the single-type path."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.goodput import GoodputModel
from pollux.policy import greedy, typed_round
from pollux.policy.configs import is_typed, on_one_type
from pollux.policy.goodput_policy import PolluxPolicy
from pollux.policy.jct import JctParams
from pollux.policy.params import PolluxParams
from pollux.policy.problem import Problem
from pollux.policy.registry import PolicySpec, make_policy
from pollux.policy.typed_placement import place
from pollux.policy.typed_problem import TableCache, _restart_factors, typed_problem
from pollux.policy.types import ClusterState, JobInfo, NodeInfo, TenantSpec
from pollux.policy.valuation import restart_factor
from tests.unit.policy_builders import NOW, job, model, random_state

TYPES = ("t4", "a100", "rtx")


def faster(m: GoodputModel, ratio: float) -> GoodputModel:
    """`m` on a type whose compute is `ratio` times as fast."""
    perf = replace(m.perf, alpha_c=m.perf.alpha_c / ratio, beta_c=m.perf.beta_c / ratio)
    return replace(m, perf=perf)


def cluster(rng: np.random.Generator) -> tuple[NodeInfo, ...]:
    out = []
    for t, gpu_type in enumerate(TYPES[: int(rng.integers(2, 4))]):
        size = int(rng.choice([4, 8]))
        out += [NodeInfo(f"{gpu_type}-{i}", size, gpu_type) for i in range(int(rng.integers(1, 4)))]
        del t
    return tuple(out)


def hetero_state(rng: np.random.Generator) -> ClusterState:
    """Random jobs on a random cluster of 2-3 types: some running (on one type, whole or
    part nodes), some restricted, some without a model, some with a gang size."""
    nodes = cluster(rng)
    present = sorted({n.gpu_type for n in nodes})
    free = {n.name: n.gpus for n in nodes}
    by_type = {t: [n.name for n in nodes if n.gpu_type == t] for t in present}
    jobs = []
    for j in range(int(rng.integers(1, 16))):
        base = job(
            f"j{j}",
            age=float(rng.uniform(30, 20000)),
            restarts=int(rng.integers(0, 4)),
            max_replicas=int(rng.choice([1, 2, 4, 8, 16, 32])),
            noise=None if rng.random() < 0.15 else float(rng.uniform(5, 500)),
        )
        running: tuple[str, ...] = ()
        if rng.random() < 0.5:
            t = str(rng.choice(present))
            names = [n for n in by_type[t] if free[n] > 0]
            if names:
                spread = names[: int(rng.integers(1, len(names) + 1))]
                for name in spread:
                    take = int(rng.integers(1, free[name] + 1))
                    free[name] -= take
                    running += (name,) * take
        models = {}
        if base.model is not None:
            models = {t: faster(base.model, float(rng.uniform(0.5, 4.0))) for t in present}
        allowed = None
        if rng.random() < 0.3:
            count = int(rng.integers(1, 3))
            allowed = frozenset(str(t) for t in rng.choice(list(TYPES), size=count, replace=False))
        jobs.append(
            replace(
                base,
                allocation=running,
                models=models,
                model=models.get(nodes[0].gpu_type, base.model) if models else None,
                gpu_types=allowed,
                min_replicas=int(rng.choice([0, 0, 0, 2])),
                max_replicas=max(base.max_replicas, 2),
                remaining_work=float(rng.uniform(1e2, 1e5)) if rng.random() < 0.8 else None,
            )
        )
    return ClusterState(NOW, nodes, tuple(jobs))


def check_decision(state: ClusterState, decision) -> None:
    """Every invariant of a typed decision (module docstring of typed_placement)."""
    node = {n.name: n for n in state.nodes}
    held: Counter[str] = Counter()
    distributed: Counter[str] = Counter()
    for info in state.jobs:
        alloc = decision.allocations[info.name]
        explain = decision.explain[info.name]
        held.update(alloc)
        if not alloc:
            assert explain.gpu_type == ""
            assert explain.speedup == 0
            continue
        types = {node[n].gpu_type for n in alloc}
        assert len(types) == 1, (info.name, alloc)  # one type per job
        (gpu_type,) = types
        assert explain.gpu_type == gpu_type
        assert explain.gpu_price is not None
        assert info.allows(gpu_type), (info.name, gpu_type, info.gpu_types)  # hard constraint
        assert len(alloc) <= max(info.max_replicas, 0)
        assert info.min_replicas == 0 or len(alloc) >= info.min_replicas
        assert len({node[n].gpus for n in alloc}) == 1  # one node group
        unchanged = Counter(alloc) == Counter(info.allocation)
        assert unchanged == explain.reason.startswith("unchanged"), explain.reason
        if not unchanged and len(set(alloc)) > 1:
            counts = Counter(alloc)
            assert all(counts[n] == node[n].gpus for n in counts)  # whole nodes
            distributed.update(counts.keys())
        if not unchanged and len(set(alloc)) == 1:
            k = len(alloc)
            assert k & (k - 1) == 0  # a power of two on one node
    for name, count in held.items():
        assert count <= node[name].gpus  # capacity never exceeded
    assert all(c == 1 for c in distributed.values())  # no node shared by two distributed jobs


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), policy=st.sampled_from(["pollux-jct", "pollux"]))
def test_typed_decisions_keep_every_constraint(seed, policy):
    state = hetero_state(np.random.default_rng(seed))
    decision = make_policy(PolicySpec(policy)).allocate(state, None, np.random.default_rng(0))
    assert set(decision.allocations) == {j.name for j in state.jobs}
    check_decision(state, decision)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_the_typed_value_is_certified(seed):
    state = hetero_state(np.random.default_rng(seed))
    problem = typed_problem(state, PolluxParams(p=0.0))
    result = typed_round.solve(problem)
    assert result.assignment.upper_bound >= result.value - 1e-9
    assert 0.0 <= result.gap <= 1.0
    # The value is what the decision's utilities add up to.
    total = sum(
        problem.value(j, float(result.placed.speed[j]), bool(result.placed.changed[j]))
        if result.placed.group[j] >= 0
        else float(problem.idle[j])
        for j in range(problem.num_jobs)
    )
    assert total - float(problem.idle.sum()) == pytest.approx(result.value, abs=1e-9)


def test_a_restriction_is_never_broken_even_when_the_other_type_is_idle():
    nodes = (NodeInfo("t0", 4, "t4"), NodeInfo("a0", 8, "a100"))
    m = model()
    jobs = tuple(
        replace(
            job(f"j{i}", max_replicas=8),
            models={"t4": m, "a100": faster(m, 3.0)},
            gpu_types=frozenset({"t4"}),
        )
        for i in range(3)
    )
    state = ClusterState(NOW, nodes, jobs)
    for policy in ("pollux-jct", "pollux"):
        decision = make_policy(PolicySpec(policy)).allocate(state, None, np.random.default_rng(0))
        check_decision(state, decision)
        assert not any("a0" in a for a in decision.allocations.values())
        assert sum(len(a) for a in decision.allocations.values()) == 4


def test_a_job_allowed_no_present_type_waits_and_says_why():
    nodes = (NodeInfo("t0", 4, "t4"), NodeInfo("a0", 8, "a100"))
    only = replace(job("j0"), gpu_types=frozenset({"h100"}))
    decision = PolluxPolicy().allocate(
        ClusterState(NOW, nodes, (only,)), None, np.random.default_rng(0)
    )
    assert decision.allocations["j0"] == ()
    assert "h100" in decision.explain["j0"].reason


def test_jobs_go_to_the_faster_type_first():
    nodes = (NodeInfo("t0", 4, "t4"), NodeInfo("a0", 4, "a100"))
    m = model()
    one = replace(job("j0", max_replicas=4), models={"t4": m, "a100": faster(m, 4.0)})
    decision = PolluxPolicy().allocate(ClusterState(NOW, nodes, (one,)), None, None)  # type: ignore[arg-type]
    assert set(decision.allocations["j0"]) == {"a0"}
    assert decision.explain["j0"].gpu_type == "a100"


# -- placement ------------------------------------------------------------------------------


def fragmented(weight_small: float, restarts: int) -> tuple[ClusterState, list[str]]:
    """Two 8-GPU a100 nodes, each holding one 1-GPU job; a big job wants both nodes."""
    nodes = (
        NodeInfo("a0", 8, "a100"),
        NodeInfo("a1", 8, "a100"),
        NodeInfo("t0", 4, "t4"),
    )
    m = model(noise=2000.0, alpha_n=0.001)
    models = {"a100": faster(m, 2.0), "t4": m}
    small = [
        replace(
            job(f"s{i}", on=(f"a{i}",), max_replicas=1, age=600.0, restarts=restarts),
            models=models,
            gpu_types=frozenset({"a100"}),
        )
        for i in range(2)
    ]
    big = replace(job("big", max_replicas=16), models=models, gpu_types=frozenset({"a100"}))
    weights = [weight_small, weight_small, 1.0]
    return ClusterState(NOW, nodes, (*small, big)), [str(w) for w in weights]


def test_fragmentation_displaces_kept_jobs_when_that_pays():
    state, _ = fragmented(0.01, restarts=0)
    problem = typed_problem(state, PolluxParams(p=0.0))
    problem = problem.weighted(weight=np.array([0.01, 0.01, 1.0]))
    stay = problem.stay
    two_nodes = next(c for c, cfg in enumerate(problem.configs) if cfg.nodes == 2)
    placed = place(problem, np.array([stay, stay, two_nodes]))
    assert Counter(placed.allocations["big"]) == {"a0": 8, "a1": 8}
    # The kept jobs had to go: nowhere of their type is left, so they wait.
    assert placed.allocations["s0"] == ()
    assert placed.allocations["s1"] == ()
    assert placed.changed[0]
    assert placed.changed[1]
    assert not placed.blocked[2]


def test_fragmentation_shrinks_the_blocked_job_when_moving_does_not_pay():
    state, _ = fragmented(1.0, restarts=0)
    problem = typed_problem(state, PolluxParams(p=0.0))
    problem = problem.weighted(weight=np.array([1.0, 1.0, 0.01]), penalty=np.array([0, 0, 1.0]))
    stay = problem.stay
    two_nodes = next(c for c, cfg in enumerate(problem.configs) if cfg.nodes == 2)
    placed = place(problem, np.array([stay, stay, two_nodes]))
    assert placed.allocations["s0"] == ("a0",)
    assert placed.allocations["s1"] == ("a1",)
    assert placed.blocked[2]
    # The best a100 option that still fits: 4 GPUs on one node (7 are free on each).
    assert len(placed.allocations["big"]) == 4
    assert len(set(placed.allocations["big"])) == 1


def test_idle_gpus_go_to_waiting_jobs_that_fit():
    nodes = (NodeInfo("a0", 8, "a100"), NodeInfo("t0", 4, "t4"))
    m = model()
    jobs = tuple(
        replace(job(f"j{i}", max_replicas=2), models={"a100": faster(m, 2.0), "t4": m})
        for i in range(3)
    )
    state = ClusterState(NOW, nodes, jobs)
    problem = typed_problem(state, PolluxParams(p=0.0))
    placed = place(problem, np.full(3, -1))  # the solver chose nothing: fill places them
    assert all(len(a) == 2 for a in placed.allocations.values())


def test_kept_jobs_keep_their_nodes_exactly():
    nodes = (NodeInfo("a0", 8, "a100"), NodeInfo("a1", 8, "a100"), NodeInfo("t0", 4, "t4"))
    m = model()
    kept = replace(
        job("k", on=("a0", "a0", "a0", "a1", "a1", "a1"), max_replicas=6),
        models={"a100": m, "t4": m},
    )
    state = ClusterState(NOW, nodes, (kept,))
    problem = typed_problem(state, PolluxParams(p=0.0))
    placed = place(problem, np.array([problem.stay]))
    assert placed.allocations["k"] == kept.allocation
    assert not placed.changed[0]


# -- the single-type path and the cache -----------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_one_gpu_type_takes_the_single_type_path(seed):
    state = random_state(np.random.default_rng(seed))
    named = replace(state, nodes=tuple(replace(n, gpu_type="t4") for n in state.nodes))
    assert not is_typed(state)
    assert not is_typed(named)
    for spec in ("pollux", "pollux-jct"):
        policy = make_policy(PolicySpec(spec))
        params = policy.explain_params
        if spec == "pollux-jct":
            params = replace(params, p=0.0)
        decision = policy.allocate(named, None, np.random.default_rng(0))
        if spec == "pollux":
            problem = Problem(state, params)
            expected = problem.decision(greedy.search(problem))
            assert decision.allocations == expected.allocations
            assert decision.explain == expected.explain
            assert decision.objective == expected.objective
        same = policy.allocate(state, None, np.random.default_rng(0))
        assert decision.allocations == same.allocations
        assert all(e.gpu_type == "" and e.gpu_price is None for e in decision.explain.values())


def test_cached_tables_change_no_decision():
    rng = np.random.default_rng(7)
    states = [hetero_state(rng) for _ in range(4)]
    cache = TableCache()
    shared = PolluxPolicy(jct=JctParams(), tables=cache)
    for state in states * 2:  # the second pass hits the cache
        fresh = PolluxPolicy(jct=JctParams(), tables=TableCache())
        a = shared.allocate(state, None, np.random.default_rng(0))
        b = fresh.allocate(state, None, np.random.default_rng(0))
        assert a.allocations == b.allocations
        assert a.explain == b.explain
    assert len(cache) > 0


def test_the_cache_keeps_its_size_bound():
    cache = TableCache(limit=10)
    rng = np.random.default_rng(1)
    for _ in range(6):
        typed_problem(hetero_state(rng), PolluxParams(), cache)
    assert all(len(store) <= 10 for store in cache.stores.values())


def test_tenant_budgets_hold_on_several_types():
    rng = np.random.default_rng(5)
    nodes = (
        *(NodeInfo(f"t{i}", 4, "t4") for i in range(4)),
        NodeInfo("a0", 8, "a100"),
        NodeInfo("a1", 8, "a100"),
    )
    m = model()
    jobs: list[JobInfo] = []
    for i in range(12):
        info = job(f"j{i}", max_replicas=16, age=float(rng.uniform(100, 9000)))
        tenant = "a" if i % 2 else "b"
        jobs.append(
            replace(
                info, models={"t4": m, "a100": faster(m, 2.5)}, tenant=tenant, remaining_work=1e4
            )
        )
    tenants = (TenantSpec("a", guarantee_gpus=8, cap_gpus=10), TenantSpec("b", guarantee_gpus=8))
    state = ClusterState(NOW, nodes, tuple(jobs), tenants)
    for spec in ("pollux", "pollux-jct"):
        decision = make_policy(PolicySpec(spec)).allocate(state, None, np.random.default_rng(0))
        check_decision(state, decision)
        held_a = sum(len(decision.allocations[j.name]) for j in jobs if j.tenant == "a")
        assert held_a <= 10
        assert "tenant a" in decision.explain["j1"].reason
        assert decision.memory is not None or spec == "pollux"


def test_on_one_type_the_model_of_that_type_is_used():
    m = model()
    fast = faster(m, 3.0)
    info = replace(job("j0", max_replicas=4), model=m, models={"t4": m, "a100": fast})
    plain = job("j1", max_replicas=4)
    state = ClusterState(NOW, (NodeInfo("a0", 4, "a100"),), (info, plain))
    swapped = on_one_type(state)
    assert swapped.jobs[0].model is fast
    assert swapped.jobs[1] is plain
    untouched = ClusterState(NOW, (NodeInfo("n0", 4),), (plain,))
    assert on_one_type(untouched) is untouched
    decision = PolluxPolicy().allocate(state, None, np.random.default_rng(0))
    expected = PolluxPolicy().allocate(swapped, None, np.random.default_rng(0))
    assert decision.explain == expected.explain


@settings(max_examples=30, deadline=None)
@given(
    ages=st.lists(st.floats(-100.0, 1e6), min_size=1, max_size=20),
    restarts=st.integers(0, 50),
    delay=st.sampled_from([0.0, 30.0, 250.0]),
)
def test_vectorised_restart_factors_match_the_scalar_rule(ages, restarts, delay):
    jobs = tuple(JobInfo(f"j{i}", NOW - a, restarts=restarts) for i, a in enumerate(ages))
    state = ClusterState(NOW, (NodeInfo("a", 4, "x"),), jobs)
    expected = [restart_factor(NOW - j.submission_time, j.restarts, delay) for j in jobs]
    assert _restart_factors(state, delay).tolist() == expected
