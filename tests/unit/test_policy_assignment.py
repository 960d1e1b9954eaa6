"""The typed round's solver: at most one option per job within per-row GPU capacities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.policy.assignment import (
    Options,
    assign,
    exact,
    greedy,
    improve,
    lp_rounded,
    priced,
)
from pollux.policy.configs import Config, NodeGroup, configs, is_typed, node_groups
from pollux.policy.types import ClusterState, JobInfo, NodeInfo

# -- configurations -------------------------------------------------------------------------


def test_node_groups_by_type_and_size_in_order():
    nodes = (
        NodeInfo("a", 4, "t4"),
        NodeInfo("b", 8, "a100"),
        NodeInfo("c", 4, "t4"),
        NodeInfo("d", 8, "t4"),
    )
    assert node_groups(nodes) == (
        NodeGroup("t4", 4, ("a", "c")),
        NodeGroup("a100", 8, ("b",)),
        NodeGroup("t4", 8, ("d",)),
    )


def test_configs_are_powers_of_two_then_whole_nodes():
    groups = (NodeGroup("t4", 4, ("a", "b", "c")), NodeGroup("a100", 8, ("x", "y")))
    shapes = [(c.group, c.nodes, c.gpus) for c in configs(groups, max_gpus=64)]
    assert shapes == [
        (0, 1, 1),
        (0, 1, 2),
        (0, 1, 4),
        (0, 2, 8),
        (0, 3, 12),
        (1, 1, 1),
        (1, 1, 2),
        (1, 1, 4),
        (1, 1, 8),
        (1, 2, 16),
    ]
    capped = configs(groups, max_gpus=8, max_nodes=2)
    assert max(c.gpus for c in capped) == 8
    assert Config(0, "t4", 2, 8) in capped
    assert Config(0, "t4", 3, 12) not in capped
    odd = configs((NodeGroup("x", 6, ("a", "b")),), max_gpus=64)
    assert [c.gpus for c in odd] == [1, 2, 4, 12]


def test_typed_path_only_with_two_types_or_a_restriction():
    one = ClusterState(0.0, (NodeInfo("a", 4, "t4"), NodeInfo("b", 4, "t4")), ())
    assert not is_typed(one)
    assert not is_typed(ClusterState(0.0, (NodeInfo("a", 4),), ()))
    assert is_typed(ClusterState(0.0, (NodeInfo("a", 4, "t4"), NodeInfo("b", 8, "a100")), ()))
    restricted = JobInfo("j", 0.0, gpu_types=frozenset({"t4"}))
    assert is_typed(ClusterState(0.0, one.nodes, (restricted,)))


# -- solvers --------------------------------------------------------------------------------


def random_options(rng: np.random.Generator, jobs: int, rows: int, tenants: int = 0) -> Options:
    """A random multiple-choice knapsack shaped like a typed round (concave gains in GPUs)."""
    sizes = np.array([1, 2, 4, 8, 16])
    width = rows * sizes.size
    gain = np.full((jobs, width), -np.inf)
    gpus = np.tile(sizes, rows)[None, :].repeat(jobs, axis=0)
    row = np.repeat(np.arange(rows), sizes.size)[None, :].repeat(jobs, axis=0)
    for j in range(jobs):
        speed = rng.uniform(0.5, 3.0, rows)
        scaling = rng.uniform(0.3, 0.95)
        weight = rng.uniform(0.1, 1.0)
        cap = int(rng.choice(sizes))
        for r in range(rows):
            if rng.random() < 0.15:
                continue  # the job may not use this row's type
            ok = sizes <= cap
            gain[j, r * sizes.size : (r + 1) * sizes.size] = np.where(
                ok, weight * np.log1p(speed[r] * sizes**scaling), -np.inf
            )
    capacity = rng.integers(4, 24, rows).astype(np.float64)
    use = row[:, :, None]
    if tenants:
        of_job = rng.integers(0, tenants, jobs)
        use = np.stack([row, rows + np.broadcast_to(of_job[:, None], row.shape)], axis=2)
        capacity = np.concatenate([capacity, rng.integers(2, 20, tenants).astype(np.float64)])
    return Options.build(gain, gpus, use, capacity)


def check_feasible(options: Options, picked: np.ndarray) -> None:
    assert picked.shape == (options.num_jobs,)
    on = picked[picked >= 0]
    assert (options.job[on] == np.nonzero(picked >= 0)[0]).all()  # each job its own entry
    assert (options.usage(picked) <= options.capacity + 1e-9).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), jobs=st.integers(1, 4), rows=st.integers(1, 3))
def test_tiny_cases_are_solved_exactly(seed, jobs, rows):
    options = random_options(np.random.default_rng(seed), jobs, rows)
    best = exact(options)
    found = lp_rounded(options)
    check_feasible(options, found.picked)
    assert found.value == pytest.approx(best.value, rel=1e-9, abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    jobs=st.integers(5, 40),
    rows=st.integers(1, 3),
    tenants=st.sampled_from([0, 0, 2]),
)
def test_lp_rounding_is_within_a_small_gap_of_the_milp(seed, jobs, rows, tenants):
    options = random_options(np.random.default_rng(seed), jobs, rows, tenants)
    best = exact(options)
    found = lp_rounded(options)
    check_feasible(options, found.picked)
    check_feasible(options, best.picked)
    assert found.value <= best.value + 1e-9
    assert found.upper_bound >= best.value - 1e-9  # the LP bound is a real bound
    assert found.value >= (1 - 0.02) * best.value
    assert found.gap == pytest.approx((found.upper_bound - found.value) / found.upper_bound)
    assert found.gap < 0.05


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), jobs=st.integers(30, 120), rows=st.integers(1, 3))
def test_prices_with_a_marginal_lp_are_near_optimal_and_certified(seed, jobs, rows):
    options = random_options(np.random.default_rng(seed), jobs, rows)
    best = exact(options)
    found = priced(options, marginal=10)
    check_feasible(options, found.picked)
    assert found.upper_bound >= best.value - 1e-6 * max(1.0, best.value)
    assert found.value >= (1 - 0.03) * best.value
    assert (found.prices >= 0).all()
    assert found.prices.size == options.capacity.size


def test_assign_switches_to_prices_above_the_marginal_count():
    rng = np.random.default_rng(3)
    small = random_options(rng, 20, 2)
    large = random_options(rng, 400, 3)
    assert assign(small).method == "lp"
    answer = assign(large)
    assert answer.method == "priced"
    check_feasible(large, answer.picked)
    assert answer.gap < 0.01


def test_no_options_gives_nothing():
    options = Options.build(
        np.full((3, 2), -np.inf), np.ones((3, 2), dtype=np.int64), np.zeros((3, 2, 1), int), [4]
    )
    for solve in (lp_rounded, priced, exact, assign):
        answer = solve(options)
        assert (answer.picked == -1).all()
        assert answer.value == 0
        assert answer.gap == 0


def test_improve_and_greedy_keep_capacity():
    rng = np.random.default_rng(11)
    options = random_options(rng, 30, 2, tenants=3)
    picked = greedy(options)
    check_feasible(options, picked)
    better = improve(options, picked)
    check_feasible(options, better)
    assert options.value(better) >= options.value(picked) - 1e-12


def test_tenant_rows_bind():
    # Two jobs of one tenant want 4 GPUs each; the tenant's budget is 4.
    gain = np.array([[1.0, 2.0], [1.0, 2.0]])
    gpus = np.array([[2, 4], [2, 4]])
    rows = np.stack([np.zeros((2, 2), int), np.ones((2, 2), int)], axis=2)
    options = Options.build(gain, gpus, rows, [8.0, 4.0])
    for solve in (lp_rounded, exact):
        answer = solve(options)
        check_feasible(options, answer.picked)
        assert options.usage(answer.picked)[1] <= 4
        assert answer.value == pytest.approx(2.0)
