"""The published NSGA-II search (variant A): feasibility, elitism, replay, warm start, NSGA-II."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.nsga2 import (
    NsgaConfig,
    NsgaMemory,
    SearchSpace,
    crossover,
    crowding_distance,
    job_order,
    non_dominated_fronts,
    objectives,
    repair,
    search,
    survive,
    tournament,
    warm_start,
)
from pollux.goodput import GoodputModel, GradParams, PerfParams
from pollux.policy import ClusterState, JobInfo, NodeInfo
from pollux.policy.params import PolluxParams
from pollux.policy.problem import Problem

SMALL = NsgaConfig(population=20, generations=10)
MODEL = GoodputModel(
    PerfParams(0.02, 0.0007, 0.15, 0.05, 0.03, 0.004, 2.0),
    GradParams(sqr=1.0, var=20.0),
    init_batch_size=128,
    max_batch_size=4096,
    min_atomic_bsz=32,
    max_atomic_bsz=512,
    accumulation=True,
)


def nodes(*gpus: int) -> tuple[NodeInfo, ...]:
    """Nodes n0, n1, ... with the given GPU counts."""
    return tuple(NodeInfo(f"n{i}", g) for i, g in enumerate(gpus))


def job(
    name: str,
    *,
    alloc: tuple[str, ...] = (),
    service: float = 0.0,
    submitted: float = 0.0,
    max_replicas: int = 8,
    min_replicas: int = 0,
) -> JobInfo:
    return JobInfo(
        name=name,
        submission_time=submitted,
        allocation=alloc,
        attained_service=service,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        model=MODEL,
    )


def problem_of(
    cluster: tuple[NodeInfo, ...], *jobs: JobInfo, params: PolluxParams | None = None
) -> Problem:
    return Problem(ClusterState(now=600.0, nodes=cluster, jobs=jobs), params or PolluxParams())


def busy_cluster(params: PolluxParams | None = None) -> Problem:
    """Three 4-GPU nodes, five jobs: two running (one distributed), caps and a minimum."""
    return problem_of(
        nodes(4, 4, 4),
        job("a", alloc=("n0", "n0"), service=50.0),
        job("b", alloc=("n1", "n1", "n2", "n2"), service=10.0, submitted=5.0),
        job("c", max_replicas=3, submitted=10.0),
        job("d", min_replicas=2, submitted=20.0),
        job("e", max_replicas=12, submitted=30.0),
        params=params,
    )


def assert_feasible(problem: Problem, matrix: np.ndarray) -> None:
    replicas = matrix.sum(axis=1)
    spans = np.count_nonzero(matrix, axis=1)
    assert (matrix >= 0).all()
    assert (matrix.sum(axis=0) <= problem.capacity).all(), "a node is over capacity"
    assert (replicas <= problem.max_k).all(), "a job exceeds max_replicas"
    assert (spans <= problem.max_nodes).all(), "a job spans too many nodes"
    assert ((replicas == 0) | (replicas >= problem.min_k)).all(), "a job is below min_replicas"
    if problem.params.interference_avoidance:
        distributed = (matrix > 0) & (spans > 1)[:, None]
        assert (distributed.sum(axis=0) <= 1).all(), "two distributed jobs share a node"


def power_mean_of(problem: Problem, matrix: np.ndarray) -> float:
    return problem.decision(matrix).objective


# -- search -----------------------------------------------------------------------------------

SCENARIOS = {
    "published defaults": PolluxParams(),
    "without interference avoidance": PolluxParams(interference_avoidance=False),
    "at most two nodes per job": PolluxParams(max_nodes_per_job=2),
    "maximising total speedup (p = 1)": PolluxParams(p=1.0),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("params", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_every_result_and_front_member_is_a_feasible_allocation(params, seed):
    problem = busy_cluster(params)
    chosen, memory = search(problem, np.random.default_rng(seed), None, SMALL)
    assert_feasible(problem, chosen)
    for member in memory.front:
        assert_feasible(problem, member)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_result_is_never_worse_than_keeping_the_current_allocation(seed):
    problem = busy_cluster()
    chosen, _ = search(problem, np.random.default_rng(seed), None, SMALL)
    assert power_mean_of(problem, chosen) >= power_mean_of(problem, problem.current) * (1 - 1e-12)


def test_the_chosen_matrix_is_the_front_member_with_the_highest_power_mean():
    problem = busy_cluster()
    chosen, memory = search(problem, np.random.default_rng(4), None, SMALL)
    scores = objectives(problem, memory.front)
    assert any((member == chosen).all() for member in memory.front)
    assert objectives(problem, chosen)[0, 0] == scores[:, 0].max()


def test_objective_one_is_the_policys_power_mean():
    problem = busy_cluster()
    chosen, _ = search(problem, np.random.default_rng(0), None, SMALL)
    for matrix in (chosen, problem.current):
        assert objectives(problem, matrix)[0, 0] == pytest.approx(power_mean_of(problem, matrix))


def test_the_same_seed_replays_the_same_round():
    first = search(busy_cluster(), np.random.default_rng(7), None, SMALL)
    again = search(busy_cluster(), np.random.default_rng(7), None, SMALL)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1].front, again[1].front)
    assert first[1].jobs == again[1].jobs == ("a", "b", "c", "d", "e")


def test_a_lone_job_on_an_empty_cluster_is_grown():
    problem = problem_of(nodes(4, 4), job("a"))
    chosen, _ = search(problem, np.random.default_rng(0), None, SMALL)
    assert chosen.sum() > 0
    assert power_mean_of(problem, chosen) > power_mean_of(problem, problem.current)


def test_no_jobs_gives_an_empty_matrix_and_memory():
    problem = problem_of(nodes(4))
    chosen, memory = search(problem, np.random.default_rng(0), None, SMALL)
    assert chosen.shape == (0, 1)
    assert memory.jobs == ()


def test_last_rounds_memory_seeds_a_feasible_search_after_jobs_and_nodes_change():
    _, memory = search(busy_cluster(), np.random.default_rng(0), None, SMALL)
    later = problem_of(
        nodes(4, 4),  # n2 left
        job("e", max_replicas=12, submitted=30.0),
        job("b", alloc=("n1", "n1"), service=10.0, submitted=5.0),
        job("f", submitted=40.0),  # new
    )
    chosen, after = search(later, np.random.default_rng(0), memory, SMALL)
    assert_feasible(later, chosen)
    assert after.jobs == ("e", "b", "f")
    assert after.nodes == ("n0", "n1")


# -- warm start -------------------------------------------------------------------------------


def test_warm_start_maps_rows_and_columns_by_name():
    memory = NsgaMemory(
        jobs=("a", "b", "c"),
        nodes=("n0", "n1", "n2"),
        front=np.array([[[1, 0, 0], [0, 2, 3], [0, 0, 4]]], dtype=np.int64),
    )
    # "a" departed, "d" is new, the survivors come in a different order; n0 left, n3 joined.
    problem = problem_of(
        (NodeInfo("n3", 4), NodeInfo("n2", 4), NodeInfo("n1", 4)),
        job("c"),
        job("d"),
        job("b"),
    )
    want = np.array([[[0, 4, 0], [0, 0, 0], [0, 3, 2]]])
    np.testing.assert_array_equal(warm_start(problem, memory), want)


def test_memory_rejects_a_front_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"memory\.front"):
        NsgaMemory(jobs=("a",), nodes=("n0", "n1"), front=np.zeros((1, 1, 3), dtype=np.int64))


# -- job order and operators ------------------------------------------------------------------


def test_jobs_are_ordered_by_attained_service_then_submission():
    problem = problem_of(
        nodes(4),
        job("a", service=5.0, submitted=0.0),
        job("b", service=1.0, submitted=9.0),
        job("c", service=1.0, submitted=3.0),
    )
    assert job_order(problem).tolist() == [2, 1, 0]


def space_of(*jobs: JobInfo, params: PolluxParams | None = None) -> SearchSpace:
    return SearchSpace.of(problem_of(nodes(4, 4), *jobs, params=params))


@pytest.mark.parametrize(
    ("jobs", "rows", "want"),
    [
        (
            [job("a", service=9.0), job("b")],
            [[2, 2], [1, 1]],
            [[0, 0], [1, 1]],
        ),
        (
            [job("a", service=9.0), job("b")],
            [[3, 0], [4, 0]],
            [[0, 0], [4, 0]],
        ),
        (
            [job("a", service=9.0), job("b")],
            [[3, 0], [1, 1]],
            [[3, 0], [1, 1]],
        ),
        (
            [job("a", min_replicas=2)],
            [[1, 0]],
            [[0, 0]],
        ),
    ],
    ids=[
        "the least-served distributed job keeps shared nodes and the other loses them",
        "node capacity goes to the least-served job first",
        "a single-node job may share a node with one distributed job",
        "a job below min_replicas is zeroed",
    ],
)
def test_repair(jobs, rows, want):
    space = space_of(*jobs)
    pop = np.array([rows], dtype=np.int64)[:, space.order, :]
    repaired = space.to_problem_order(repair(space, pop, np.random.default_rng(0)))
    np.testing.assert_array_equal(repaired[0], want)


@pytest.mark.parametrize("seed", range(5))
def test_repair_trims_a_job_to_its_max_replicas_and_max_nodes(seed):
    space = SearchSpace.of(
        problem_of(
            nodes(4, 4, 4), job("a", max_replicas=5), params=PolluxParams(max_nodes_per_job=2)
        )
    )
    pop = np.array([[[3, 3, 3]]], dtype=np.int64)
    repaired = repair(space, pop, np.random.default_rng(seed))[0, 0]
    assert repaired.sum() == 5
    assert np.count_nonzero(repaired) == 2
    assert (repaired <= 3).all()


def test_crossover_swaps_the_rows_before_one_cut_point():
    pop = np.stack([np.full((4, 2), 1), np.full((4, 2), 2)]).astype(np.int64)
    parents = np.array([[0, 1]] * 30)
    children = crossover(pop, parents, np.random.default_rng(0))
    first, second = children[:30, :, 0], children[30:, :, 0]
    np.testing.assert_array_equal(first + second, 3)
    for row in first:
        cut = int(np.argmax(row == 1)) if (row == 1).any() else 4
        assert (row[:cut] == 2).all()
        assert (row[cut:] == 1).all()


def test_a_tournament_is_won_by_the_better_rank():
    parents = tournament(np.array([0, 1]), np.array([0.0, 9.0]), 5, np.random.default_rng(0))
    assert parents.shape == (5, 2)
    assert (parents == 0).all()


# -- NSGA-II sorting and crowding -------------------------------------------------------------


def test_non_dominated_sorting_of_maximised_objectives():
    scores = np.array([[3, 1], [1, 3], [2, 2], [1, 1], [0, 0], [2, 2]], dtype=float)
    fronts = non_dominated_fronts(scores)
    assert [f.tolist() for f in fronts] == [[0, 1, 2, 5], [3], [4]]
    assert [f.tolist() for f in non_dominated_fronts(scores, enough=4)] == [[0, 1, 2, 5]]


def test_crowding_distance_of_a_small_front():
    scores = np.array([[1, 5], [2, 3], [3, 2], [4, 1], [2, 3]], dtype=float)
    # Interior points: neighbour gap over range, averaged over both objectives; the repeat
    # of point 1 gets 0, the boundary points infinity.
    want = [np.inf, (2 / 3 + 3 / 4) / 2, (2 / 3 + 2 / 4) / 2, np.inf, 0.0]
    np.testing.assert_allclose(crowding_distance(scores), want)


def test_crowding_distance_of_two_points_is_infinite():
    assert np.isinf(crowding_distance(np.array([[1.0, 2.0], [2.0, 1.0]]))).all()


def test_survival_keeps_whole_fronts_then_the_least_crowded():
    scores = np.array([[4, 1], [1, 4], [3, 3], [2, 2.5], [1, 1]], dtype=float)
    keep, rank, crowd = survive(scores, 4, np.random.default_rng(0))
    assert keep.tolist() == [0, 1, 2, 3]
    assert rank.tolist() == [0, 0, 0, 1]
    np.testing.assert_array_equal(crowd, [np.inf, np.inf, 1.0, np.inf])
    split = np.array([[4, 1], [1, 4], [3, 2], [2, 3]], dtype=float)
    keep, _, _ = survive(split, 2, np.random.default_rng(0))
    assert sorted(keep.tolist()) == [0, 1], "the front's boundary points survive"
