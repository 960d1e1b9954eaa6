"""The published Pollux search: NSGA-II over jobs × nodes matrices (reference §4, variant A).

A benchmark baseline, not a policy setting. Our Pollux policy (`pollux.policy.goodput_policy`)
replaces the genetic search with a greedy marginal-gain solver; `NsgaPolicy` runs faithful
Pollux with this search instead, on the same `Problem`, so only the optimiser differs
(benchmarks/policy_latency.py). No tenants. Everything follows the artifact
(`A:pollux.py`, pymoo 0.4 NSGA-II defaults) except the warm start, which maps the last front
by job and node *name* instead of by position (the published bug, reference §4.5).

The genome is an integer matrix X[j, n] = replicas of job j on node n. Jobs are kept in the
artifact's priority order (least attained service first) throughout, because repair and
crossover depend on it; results are mapped back to the problem's order at the end. All
randomness comes from the caller's generator, so a seed replays a round exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from pollux.policy.allocation import validate_state
from pollux.policy.exploration import FAITHFUL, Exploration
from pollux.policy.params import PolicyInputError, PolluxParams
from pollux.policy.problem import Problem
from pollux.policy.types import AllocationDecision, ClusterState, JobExplain, JobSizing

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

CROSSOVER_PROB = 0.9
"""Chance that a mating pair is crossed rather than copied (pymoo `Crossover` default)."""
RESET_PROB = 0.1
"""Mutation step 1: chance a job's row is reset to its current allocation (reference §4.4)."""
MARK_PROB = 0.1
"""Mutation step 2: chance a job's row is marked for zeroing."""
ZERO_PROB = 0.1
"""Mutation step 2: chance each cell of a marked row is zeroed."""
MAX_REFILLS = 100
"""Extra mating rounds to replace offspring lost to duplicate elimination (pymoo default)."""


@dataclass(frozen=True, slots=True)
class NsgaConfig:
    """Size of the search; the defaults are the published ones (reference §4.4).

    Attributes:
        population: Individuals kept by survival, and offspring bred per generation.
        generations: Generations counted as pymoo's `n_gen` does, the initial population
            included: the search breeds offspring `generations - 1` times.
    """

    population: int = 100
    generations: int = 100

    def __post_init__(self) -> None:
        if self.population < 1:
            raise PolicyInputError("config.population", f"must be ≥ 1, got {self.population}")
        if self.generations < 1:
            raise PolicyInputError("config.generations", f"must be ≥ 1, got {self.generations}")


@dataclass(frozen=True, slots=True)
class NsgaMemory:
    """The last round's final non-dominated front, keyed by job and node NAME.

    Keying by name fixes the published positional warm-start bug (reference §4.5).

    Attributes:
        jobs: Job name of each row.
        nodes: Node name of each column.
        front: Replicas per (individual, job, node), shape (individuals, jobs, nodes).
    """

    jobs: tuple[str, ...]
    nodes: tuple[str, ...]
    front: IntArray

    def __post_init__(self) -> None:
        if self.front.ndim != 3 or self.front.shape[1:] != (len(self.jobs), len(self.nodes)):
            raise PolicyInputError(
                "memory.front",
                f"shape {self.front.shape} does not match {len(self.jobs)} jobs × "
                f"{len(self.nodes)} nodes",
            )


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """The problem's per-job data permuted into the search's job order (reference §4.2).

    Every population inside the search has shape (individuals, jobs, nodes) with jobs in
    this order.

    Attributes:
        problem: The round's problem (its own job order).
        order: Problem index of the job at each search position.
        current: Current allocation, jobs × nodes, in search order.
        max_k: Most replicas per job, in search order.
        min_k: Fewest replicas per job once allocated, in search order.
    """

    problem: Problem
    order: IntArray
    current: IntArray
    max_k: IntArray
    min_k: IntArray

    @classmethod
    def of(cls, problem: Problem) -> SearchSpace:
        """The search space of `problem`, jobs ordered by `job_order`."""
        order = job_order(problem)
        return cls(
            problem=problem,
            order=order,
            current=problem.current[order],
            max_k=problem.max_k[order],
            min_k=problem.min_k[order],
        )

    def to_problem_order(self, matrices: IntArray) -> IntArray:
        """Matrices (…, jobs, nodes) with rows back in the problem's job order."""
        out = np.empty_like(matrices)
        out[..., self.order, :] = matrices
        return out


@dataclass(frozen=True, slots=True)
class _Population:
    """Survivors of a generation (search job order) with their scores, ranks and crowding."""

    members: IntArray
    scores: FloatArray
    rank: IntArray
    crowd: FloatArray


def search(
    problem: Problem,
    rng: np.random.Generator,
    memory: NsgaMemory | None,
    config: NsgaConfig = NsgaConfig(),
) -> tuple[IntArray, NsgaMemory]:
    """Run the published NSGA-II search for one round.

    Args:
        problem: The round's jobs, nodes, speedups and penalties.
        rng: The only source of randomness.
        memory: The front `search` returned last round, or None on the first round.
        config: Population size and number of generations.

    Returns:
        The chosen jobs × nodes matrix (problem's job order) and the memory for next round.
    """
    if problem.num_jobs == 0 or not problem.node_names:
        return problem.current.copy(), _remember(problem, problem.current[None])
    space = SearchSpace.of(problem)
    members = initial_population(space, memory, rng)
    pop = _survivors(members, _evaluate(space, members), config.population, rng)
    for _ in range(config.generations - 1):
        children = _offspring(space, pop, config.population, rng)
        if len(children) == 0:
            break  # pymoo stops when duplicate elimination leaves nothing new
        members = np.concatenate([pop.members, children])
        scores = np.concatenate([pop.scores, _evaluate(space, children)])
        pop = _survivors(members, scores, config.population, rng)
    # Reference §4.6 A: the front's highest power mean; utility only steered the search.
    front = np.nonzero(pop.rank == 0)[0]
    best = front[int(np.argmax(pop.scores[front, 0]))]
    chosen = space.to_problem_order(pop.members[best])
    return chosen, _remember(problem, space.to_problem_order(pop.members[front]))


def job_order(problem: Problem) -> IntArray:
    """Problem indices of the jobs by (attained service, submission time) (reference §4.2 A).

    Earlier jobs win contended nodes in repair; ties keep the problem's order.
    """
    jobs = problem.state.jobs
    ranked = sorted(
        range(len(jobs)), key=lambda j: (jobs[j].attained_service, jobs[j].submission_time)
    )
    return np.array(ranked, dtype=np.int64)


def objectives(problem: Problem, matrices: IntArray) -> FloatArray:
    """Both objectives, maximised, of matrices (…, jobs, nodes) in the problem's job order.

    Returns:
        Shape (individuals, 2): the power mean of scaled speedups and the cluster utility.
    """
    space = SearchSpace.of(problem)
    return _evaluate(space, matrices.reshape(-1, *problem.current.shape)[:, space.order, :])


# -- warm start (reference §4.5) --------------------------------------------------------------


def warm_start(problem: Problem, memory: NsgaMemory) -> IntArray:
    """The remembered front on this round's grid, matched by job and node name.

    Departed jobs and nodes are dropped; new jobs get zero rows and new nodes zero columns.

    Returns:
        Shape (individuals, jobs, nodes) in the problem's job order.
    """
    old_jobs = {name: i for i, name in enumerate(memory.jobs)}
    old_nodes = {name: i for i, name in enumerate(memory.nodes)}
    names = [job.name for job in problem.state.jobs]
    new_j = np.array([j for j, name in enumerate(names) if name in old_jobs], dtype=np.int64)
    new_n = np.array(
        [n for n, name in enumerate(problem.node_names) if name in old_nodes], dtype=np.int64
    )
    old_j = np.array([old_jobs[names[j]] for j in new_j], dtype=np.int64)
    old_n = np.array([old_nodes[problem.node_names[n]] for n in new_n], dtype=np.int64)
    out = np.zeros((len(memory.front), *problem.current.shape), dtype=np.int64)
    out[:, new_j[:, None], new_n[None, :]] = memory.front[:, old_j[:, None], old_n[None, :]]
    return out


def initial_population(
    space: SearchSpace, memory: NsgaMemory | None, rng: np.random.Generator
) -> IntArray:
    """The current allocation plus the remembered front, repaired, without duplicates.

    Not padded to the population size: pymoo starts from exactly the sampling (§4.4).
    """
    seeds = [space.problem.current[None]]
    if memory is not None:
        seeds.append(warm_start(space.problem, memory))
    pop = np.concatenate(seeds)[:, space.order, :]
    return _unseen(repair(space, pop, rng), set())


def _remember(problem: Problem, front: IntArray) -> NsgaMemory:
    """Name the rows and columns of a front given in the problem's job order."""
    names = tuple(job.name for job in problem.state.jobs)
    return NsgaMemory(jobs=names, nodes=tuple(problem.node_names), front=front.copy())


# -- objectives (reference §4.3 A) ------------------------------------------------------------


def _evaluate(space: SearchSpace, pop: IntArray) -> FloatArray:
    """(power mean, cluster utility) of each individual, both to be maximised."""
    problem = space.problem
    replicas = pop.sum(axis=2)
    nodes = np.count_nonzero(pop, axis=2)
    utilities = np.empty(replicas.shape)
    speedups = np.zeros(replicas.shape)
    # One call per job over the whole population, as the artifact vectorises it.
    for i, j in enumerate(space.order):
        utilities[:, i] = problem.values(int(j), pop[:, i, :])
        some = replicas[:, i] > 0
        if some.any():
            speedups[some, i] = problem.speedup[j](nodes[some, i], replicas[some, i])
    fairness = _power_mean_of_utilities(utilities.mean(axis=1), problem.params.p)
    return np.stack([fairness, _cluster_utility(space, pop, replicas, speedups)], axis=1)


def _power_mean_of_utilities(mean_utility: FloatArray, p: float) -> FloatArray:
    """Power mean of x from the mean of w_p(x) = x^p / p (log x at p = 0), see valuation."""
    if p == 0:
        return np.asarray(np.exp(mean_utility), dtype=np.float64)
    return np.asarray((p * mean_utility) ** (1.0 / p), dtype=np.float64)


def _cluster_utility(
    space: SearchSpace, pop: IntArray, replicas: IntArray, speedups: FloatArray
) -> FloatArray:
    """Σ_j (speedup_j / K_j) × (K_j / GPUs on active nodes) (reference §4.3 step 5).

    Only one resource type (GPUs, one per replica), so the max over types is this sum.
    """
    active = pop.sum(axis=1) > 0
    active_gpus = active.astype(np.int64) @ space.problem.capacity
    running = replicas > 0
    per_gpu = np.divide(speedups, replicas, out=np.zeros(speedups.shape), where=running)
    share = np.divide(
        replicas,
        active_gpus[:, None],
        out=np.zeros(speedups.shape),
        where=active_gpus[:, None] > 0,
    )
    return np.asarray((per_gpu * share).sum(axis=1), dtype=np.float64)


# -- variation: crossover, mutation A, repair A (reference §4.4) ------------------------------


def _offspring(
    space: SearchSpace, pop: _Population, count: int, rng: np.random.Generator
) -> IntArray:
    """Up to `count` repaired children, none equal to each other or to the population."""
    seen = {member.tobytes() for member in pop.members}
    found: list[IntArray] = []
    have = 0
    for _ in range(1 + MAX_REFILLS):
        parents = tournament(pop.rank, pop.crowd, math.ceil((count - have) / 2), rng)
        children = crossover(pop.members, parents, rng)
        children = repair(space, mutate(space, children, rng), rng)
        fresh = _unseen(children, seen)[: count - have]
        seen.update(child.tobytes() for child in fresh)
        found.append(fresh)
        have += len(fresh)
        if have >= count:
            break
    return np.concatenate(found)


def _unseen(pop: IntArray, seen: set[bytes]) -> IntArray:
    """Individuals of `pop` not in `seen` and not repeating an earlier one (first kept)."""
    fresh: set[bytes] = set()
    kept = []
    for i, member in enumerate(pop):
        key = member.tobytes()
        if key not in seen and key not in fresh:
            fresh.add(key)
            kept.append(i)
    return pop[kept]


def crossover(pop: IntArray, parents: IntArray, rng: np.random.Generator) -> IntArray:
    """Single point on the job axis: children swap the rows of jobs before the point.

    Each pair is crossed with probability `CROSSOVER_PROB`, else copied. Returns all first
    children, then all second children (pymoo's layout).
    """
    first, second = pop[parents[:, 0]], pop[parents[:, 1]]
    num_jobs = pop.shape[1]
    crossed = rng.random(len(parents)) < CROSSOVER_PROB
    points = rng.integers(0, num_jobs, size=len(parents))
    swap = ((np.arange(num_jobs)[None, :] < points[:, None]) & crossed[:, None])[:, :, None]
    return np.concatenate([np.where(swap, second, first), np.where(swap, first, second)])


def mutate(space: SearchSpace, pop: IntArray, rng: np.random.Generator) -> IntArray:
    """Mutation A: reset rows to current, zero cells of marked rows, then grow (§4.4)."""
    shape = pop.shape
    reset = rng.random(shape[:2]) < RESET_PROB
    out = np.where(reset[:, :, None], space.current[None], pop)
    marked = rng.random(shape[:2]) < MARK_PROB
    out[marked[:, :, None] & (rng.random(shape) < ZERO_PROB)] = 0
    return _grow(space, out, rng)


def _grow(space: SearchSpace, pop: IntArray, rng: np.random.Generator) -> IntArray:
    """Mutation A step 3: grow about one random job and one resident job per roomy node.

    On each node with a free GPU, a selected cell is resampled uniformly between its own
    count and the node's capacity (it never shrinks; repair trims the excess).
    """
    capacity = space.problem.capacity
    free = capacity[None, :] - pop.sum(axis=1)
    fits = np.broadcast_to((free >= 1)[:, None, :], pop.shape)
    present = fits & (pop > 0)
    # Both denominators count jobs per (individual, node), as in the artifact.
    p1 = fits / np.maximum(fits.sum(axis=1, keepdims=True), 1)
    p2 = present / np.maximum(present.sum(axis=1, keepdims=True), 1)
    chosen = rng.random(pop.shape) < p1 + p2 - p1 * p2
    out = pop.copy()
    bound = np.broadcast_to(capacity[None, None, :], pop.shape)
    out[chosen] = rng.integers(pop[chosen], bound[chosen] + 1)
    return out


def repair(space: SearchSpace, pop: IntArray, rng: np.random.Generator) -> IntArray:
    """Repair A (reference §4.4): make every individual a feasible allocation.

    In order: interference avoidance; max replicas, then max nodes, per job, walking its
    nodes in a random order drawn per individual and job; node capacity, granted to jobs in
    priority order; min replicas (a job below them is zeroed).
    """
    problem = space.problem
    out = _avoid_interference(pop) if problem.params.interference_avoidance else pop.copy()
    shuffle = np.argsort(rng.random(out.shape), axis=2)
    walked = np.take_along_axis(out, shuffle, axis=2)
    walked = _keep_prefix(walked, space.max_k[None, :, None], axis=2)
    walked[np.cumsum(walked > 0, axis=2) > problem.max_nodes] = 0
    np.put_along_axis(out, shuffle, walked, axis=2)
    out = _keep_prefix(out, problem.capacity[None, None, :], axis=1)
    out[out.sum(axis=2) < space.min_k[None, :]] = 0
    return out


def _avoid_interference(pop: IntArray) -> IntArray:
    """On each node only the first distributed job (in job order) keeps its replicas."""
    held = pop > 0
    distributed = held.sum(axis=2, keepdims=True) > 1
    on_node = held & distributed
    out = pop.copy()
    out[on_node & (np.cumsum(on_node, axis=1) > 1)] = 0
    return out


def _keep_prefix(values: IntArray, limit: IntArray, axis: int) -> IntArray:
    """Walk `axis` keeping values until their running total reaches `limit`; cut the rest."""
    before = np.cumsum(values, axis=axis) - values
    return np.minimum(values, np.maximum(limit - before, 0))


# -- NSGA-II selection and survival -----------------------------------------------------------


def non_dominated_fronts(scores: FloatArray, enough: int | None = None) -> list[IntArray]:
    """Indices of each non-domination front, best first (every objective maximised).

    Equal points do not dominate each other, so they share a front.

    Args:
        scores: Shape (points, objectives).
        enough: Stop once the fronts found hold at least this many points (pymoo's
            `n_stop_if_ranked`); None ranks every point.
    """
    geq: BoolArray = np.all(scores[:, None, :] >= scores[None, :, :], axis=2)
    gt: BoolArray = np.any(scores[:, None, :] > scores[None, :, :], axis=2)
    dominates = geq & gt  # [a, b]: a dominates b
    beaten_by = dominates.sum(axis=0)
    remaining = np.ones(len(scores), dtype=bool)
    fronts = []
    stop = len(scores) - (len(scores) if enough is None else min(enough, len(scores)))
    while remaining.sum() > stop:
        front = np.nonzero(remaining & (beaten_by == 0))[0]
        fronts.append(front)
        remaining[front] = False
        beaten_by -= dominates[front].sum(axis=0)
    return fronts


def crowding_distance(scores: FloatArray) -> FloatArray:
    """Crowding distance of the points of one front, as pymoo 0.4 computes it.

    Per objective, the gap between a point's neighbours over the objective's range, averaged
    over objectives; boundary points get infinity (0 for an objective with no range). A
    repeat of an earlier point gets 0, so copies do not crowd out distinct solutions; with
    at most two points every point gets infinity.
    """
    count, num_obj = scores.shape
    if count <= 2:
        return np.full(count, np.inf)
    unique = np.zeros(count, dtype=bool)
    unique[np.unique(scores, axis=0, return_index=True)[1]] = True
    points = scores[unique]
    order = np.argsort(points, axis=0, kind="stable")
    ranked = np.take_along_axis(points, order, axis=0)
    span = ranked[-1] - ranked[0]
    edge = np.full((1, num_obj), np.inf)
    gaps = np.concatenate([edge, np.diff(ranked, axis=0), edge])
    spread = np.divide(
        gaps[:-1] + gaps[1:],
        span,
        out=np.zeros(ranked.shape),
        where=np.broadcast_to(span > 0, ranked.shape),
    )
    per_point = np.empty_like(spread)
    np.put_along_axis(per_point, order, spread, axis=0)
    out = np.zeros(count)
    out[unique] = per_point.mean(axis=1)
    return out


def survive(
    scores: FloatArray, size: int, rng: np.random.Generator
) -> tuple[IntArray, IntArray, FloatArray]:
    """Rank-and-crowding survival: whole fronts while they fit, then the least crowded.

    Ties in crowding within the split front are broken at random (pymoo's randomised sort).

    Returns:
        Indices of the survivors (front by front), and their rank and crowding distance.
    """
    keep: list[IntArray] = []
    ranks: list[IntArray] = []
    crowds: list[FloatArray] = []
    room = size
    for rank, front in enumerate(non_dominated_fronts(scores, enough=size)):
        crowd = crowding_distance(scores[front])
        chosen = np.arange(len(front))
        if len(front) > room:
            shuffled = rng.permutation(len(front))
            chosen = shuffled[np.argsort(-crowd[shuffled], kind="stable")][:room]
        keep.append(front[chosen])
        ranks.append(np.full(len(chosen), rank, dtype=np.int64))
        crowds.append(crowd[chosen])
        room -= len(chosen)
        if room == 0:
            break
    return np.concatenate(keep), np.concatenate(ranks), np.concatenate(crowds)


def _survivors(
    members: IntArray, scores: FloatArray, size: int, rng: np.random.Generator
) -> _Population:
    """The population that rank-and-crowding survival keeps of `members`."""
    keep, rank, crowd = survive(scores, size, rng)
    return _Population(members[keep], scores[keep], rank, crowd)


def tournament(
    rank: IntArray, crowd: FloatArray, matings: int, rng: np.random.Generator
) -> IntArray:
    """Binary tournaments on (lower rank, then larger crowding, then a coin): parent pairs.

    Contestants are drawn as pymoo does, from concatenated random permutations.

    Returns:
        Shape (matings, 2): indices of the two parents of each mating.
    """
    draws = matings * 2 * 2
    laps = math.ceil(draws / len(rank))
    contest = np.concatenate([rng.permutation(len(rank)) for _ in range(laps)])[:draws]
    a, b = contest.reshape(-1, 2).T
    coin = rng.random(len(a)) < 0.5
    same_rank = rank[a] == rank[b]
    a_wins = (rank[a] < rank[b]) | (
        same_rank & ((crowd[a] > crowd[b]) | ((crowd[a] == crowd[b]) & coin))
    )
    return np.where(a_wins, a, b).reshape(matings, 2)


@dataclass(frozen=True, slots=True)
class NsgaPolicy:
    """Faithful Pollux searched by the published NSGA-II (a `Policy`; module docstring).

    Its memory is the last round's front (`NsgaMemory`).
    """

    params: PolluxParams = field(default_factory=PolluxParams)
    config: NsgaConfig = field(default_factory=NsgaConfig)

    @property
    def name(self) -> str:
        """A benchmark's name for it."""
        return "pollux-nsga2"

    @property
    def sizing(self) -> JobSizing:
        """As Pollux: GPU count and batch size adapt."""
        return JobSizing.ADAPTIVE

    @property
    def exploration(self) -> Exploration:
        """Pollux's rule."""
        return FAITHFUL

    @property
    def needs_oracle(self) -> bool:
        """No oracle."""
        return False

    @property
    def objective_text(self) -> str:
        """Faithful Pollux's objective."""
        return "the power mean of speedups, p = -1"

    @property
    def explain_params(self) -> PolluxParams:
        """The objective's parameters."""
        return self.params

    @property
    def user_fairness(self) -> bool:
        """False: the published search weighs every job alike, whoever owns it."""
        return False

    def replica_limit(self, profiled: int, held: int, cap: int) -> int:
        """Pollux's exploration limit within `cap`."""
        return max(1, min(cap, FAITHFUL.limit(profiled, held)))

    def allocate(
        self, state: ClusterState, memory: NsgaMemory | None, rng: np.random.Generator
    ) -> AllocationDecision[NsgaMemory]:
        """Choose every job's allocation for this round.

        Raises:
            PolicyInputError: The state is invalid or has tenants (not supported).
        """
        validate_state(state)
        if state.tenants:
            raise PolicyInputError("tenants", "the NSGA-II baseline does not support tenants")
        if not state.nodes:
            return AllocationDecision(
                allocations={job.name: () for job in state.jobs},
                explain={
                    job.name: JobExplain(0.0, 1.0, "pending: no nodes in the cluster")
                    for job in state.jobs
                },
            )
        problem = Problem(state, self.params)
        if problem.num_jobs == 0:
            return AllocationDecision(allocations={}, explain={})
        placed, front = search(problem, rng, memory, self.config)
        decision: AllocationDecision[NsgaMemory] = problem.decision(placed)
        return replace(decision, memory=front)
