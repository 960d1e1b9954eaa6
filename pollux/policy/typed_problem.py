"""One Pollux round on several GPU types as a table: jobs × configurations, utilities.

Each job takes at most one option: a configuration of one node group
(`pollux.policy.configs`), or its current allocation kept where it is (the last column,
never penalised). Utilities are the live objective's: U = w · u_p(scale · s · ρ + ε), u_p as
in `pollux.policy.valuation.utility`, s the goodput on the option over the job's normaliser,
ρ its restart factor (1 for keeping), w its weight (`pollux.policy.weights`). The normaliser
is the fair-share one of the single-type policy, on the GPU-weighted mean of the job's
allowed types, so on one type it is exactly that policy's. The objective is separable, so
the solver (`pollux.policy.assignment`) sees gains U − U0 (U0: no GPUs) per option.
Goodputs are memoised across rounds per (job, GPU type) while the job's model is the same
(`TableCache`): that keeps a round of 10 000 jobs to the jobs whose models moved.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from pollux.goodput import GoodputModel
from pollux.goodput.batch import GoodputModels
from pollux.policy.configs import Config, NodeGroup, configs, node_groups
from pollux.policy.params import Normalisation, PolluxParams
from pollux.policy.types import ClusterState, JobInfo
from pollux.policy.valuation import fair_share, utility

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def model_for(job: JobInfo, gpu_type: str) -> GoodputModel | None:
    """The job's model on `gpu_type`: its own, else its current type's, else any it has.

    A type it has no model for gets one it has as it is (speed ratio 1), so that the policy
    tries it; `pollux.goodput.typed.bootstrap` makes better ones from measured ratios.
    """
    own = job.models.get(gpu_type)
    if own is not None:
        return own
    if job.model is not None:
        return job.model
    if job.models:
        return job.models[min(job.models)]
    return None


class _Store:
    """One node group's goodputs, a row per job (NaN: not computed yet).

    A row holds the job's model and its goodput on the group's configurations, on the
    normaliser's reference sizes and on its kept allocation.
    """

    def __init__(self, width: int) -> None:
        self.index: dict[str, int] = {}
        self.models: list[GoodputModel] = []
        self.values = np.empty((0, width))
        self.ref_key = (0, 0)
        self.ref = np.empty((0, 0))
        self.cur_key = np.zeros((0, 2), dtype=np.int64)
        self.cur = np.empty(0)
        self.stamp = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.index)

    def rows(
        self, names: list[str], models: list[GoodputModel], stamp: int, ref_key: tuple[int, int]
    ) -> IntArray:
        """Each job's row, emptied where its model changed, added where it had none."""
        out = np.empty(len(names), dtype=np.int64)
        fresh: list[int] = []
        index, known = self.index, self.models
        for i, (name, model) in enumerate(zip(names, models, strict=True)):
            row = index.get(name)
            if row is None:
                row = len(known)
                index[name] = row
                known.append(model)
                fresh.append(row)
            elif not (known[row] is model or known[row] == model):
                known[row] = model
                fresh.append(row)
            out[i] = row
        grow = len(known) - self.values.shape[0]
        if grow > 0:
            self.values = np.concatenate([self.values, np.empty((grow, self.values.shape[1]))])
            self.ref = np.concatenate([self.ref, np.empty((grow, self.ref.shape[1]))])
            self.cur_key = np.concatenate([self.cur_key, np.zeros((grow, 2), dtype=np.int64)])
            self.cur = np.concatenate([self.cur, np.empty(grow)])
            self.stamp = np.concatenate([self.stamp, np.zeros(grow, dtype=np.int64)])
        if ref_key != self.ref_key:
            self.ref_key = ref_key
            self.ref = np.full((self.values.shape[0], ref_key[1]), np.nan)
        reset = np.array(fresh, dtype=np.int64)
        self.values[reset] = np.nan
        self.ref[reset] = np.nan
        self.cur_key[reset] = 0
        self.cur[reset] = np.nan
        self.stamp[out] = stamp
        return out

    def keep(self, limit: int) -> None:
        """Drop the rows unused longest until at most `limit` remain."""
        if len(self.index) <= limit:
            return
        kept = np.sort(np.argsort(-self.stamp, kind="stable")[:limit])
        names = {row: name for name, row in self.index.items()}
        self.index = {names[int(r)]: i for i, r in enumerate(kept.tolist())}
        self.models = [self.models[int(r)] for r in kept.tolist()]
        self.values, self.ref = self.values[kept], self.ref[kept]
        self.cur_key, self.cur, self.stamp = self.cur_key[kept], self.cur[kept], self.stamp[kept]


class TableCache:
    """Goodputs per (job, node group) kept across rounds while the job's model is unchanged.

    A hit needs the very model (or an equal one): the values are those a fresh computation
    gives, so a decision never depends on what the cache held. At most `limit` jobs per
    group; the ones unused longest go first. Safe to share between threads; pickles empty.
    """

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.stores: dict[tuple[str, int, int], _Store] = {}
        self.round = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(int(state["limit"]))  # type: ignore[misc]

    def __len__(self) -> int:
        return sum(len(store) for store in self.stores.values())

    def store(self, group: NodeGroup, width: int) -> _Store:
        """The store of `group`'s goodputs over its `width` configurations."""
        key = (group.gpu_type, group.gpus_per_node, width)
        if key not in self.stores:
            self.stores[key] = _Store(width)
        return self.stores[key]


@dataclass(frozen=True, eq=False)
class TypedProblem:
    """One round's choices on several GPU types (module docstring); arrays read-only.

    Columns 0 … C − 1 are `configs`; column C keeps the job's current allocation.

    Attributes:
        state: The round's state.
        params: The objective's knobs (its p, restart delay, ε, normalisation).
        groups: The node groups.
        configs: Every configuration of every group.
        config_group: Group of each configuration (C).
        config_nodes: Nodes of each configuration (C).
        config_gpus: GPUs of each configuration (C).
        speedup: J × (C + 1) speedups s (goodput over `base`), NaN where not allowed.
        current_group: Group of each job's current allocation; −1: it holds nothing, or
            nothing it may keep (several groups, a type it may not use, out of its bounds).
        current_nodes: Nodes it spans now (0: none).
        current_gpus: GPUs it holds now (0: none).
        base: Each job's goodput of speedup 1 (its fair share on its allowed types' mean).
        scale: Factor on every speedup (the single-type policy's: nodes per GPU).
        penalty: Each job's restart factor ρ, in [0, 1].
        weight: Each job's utility weight; None: all alike.
        utility: J × (C + 1) utilities, −inf where not allowed.
        idle: Each job's utility with no GPUs.
    """

    state: ClusterState
    params: PolluxParams
    groups: tuple[NodeGroup, ...]
    configs: tuple[Config, ...]
    config_group: IntArray
    config_nodes: IntArray
    config_gpus: IntArray
    speedup: FloatArray
    current_group: IntArray
    current_nodes: IntArray
    current_gpus: IntArray
    base: FloatArray
    scale: float
    penalty: FloatArray
    weight: FloatArray | None
    utility: FloatArray
    idle: FloatArray

    @property
    def num_jobs(self) -> int:
        """J."""
        return len(self.state.jobs)

    @property
    def stay(self) -> int:
        """The column that keeps a job's current allocation (C)."""
        return len(self.configs)

    @property
    def capacity(self) -> IntArray:
        """GPUs of each group."""
        return np.array([g.capacity for g in self.groups], dtype=np.int64)

    def option_group(self) -> IntArray:
        """J × (C + 1): the group of each option (−1 where the job cannot keep anything)."""
        groups = np.broadcast_to(self.config_group, (self.num_jobs, len(self.configs)))
        return np.concatenate([groups, self.current_group[:, None]], axis=1)

    def option_gpus(self) -> IntArray:
        """J × (C + 1): the GPUs of each option."""
        gpus = np.broadcast_to(self.config_gpus, (self.num_jobs, len(self.configs)))
        return np.concatenate([gpus, self.current_gpus[:, None]], axis=1)

    def value(self, j: int, speed: float, changed: bool) -> float:
        """U of job j at `speed`, re-allocated or not (its `idle` at speed 0)."""
        factor = float(self.penalty[j]) if changed else 1.0
        x = self.scale * speed * factor + self.params.epsilon
        u = float(utility(np.array([x]), self.params.p)[0])
        return u if self.weight is None else u * float(self.weight[j])

    def weighted(
        self, *, weight: FloatArray | None = None, penalty: FloatArray | None = None
    ) -> TypedProblem:
        """This problem with job weights `weight` and, if given, restart factors `penalty`."""
        penalty = self.penalty if penalty is None else np.asarray(penalty, dtype=np.float64)
        u, idle = _utilities(self.speedup, self.scale, penalty, weight, self.params, self.stay)
        return replace(self, penalty=_frozen(penalty), weight=weight, utility=u, idle=idle)


def typed_problem(
    state: ClusterState, params: PolluxParams, tables: TableCache | None = None
) -> TypedProblem:
    """The round's `TypedProblem`, every job alike, faithful restart factors.

    Derive the jct mode's or the tenants' version with `TypedProblem.weighted`. `tables`:
    goodputs kept from earlier rounds (None: computed afresh).
    """
    jobs = state.jobs
    groups = node_groups(state.nodes)
    total = sum(g.capacity for g in groups)
    node_count = len(state.nodes)
    biggest = max((g.gpus_per_node for g in groups), default=0)
    node_cap = params.max_nodes_per_job or node_count
    max_nodes = max(1, min(node_cap, node_count))
    configs_ = configs(groups, max_gpus=max(total, 1), max_nodes=max_nodes)
    c_group = np.array([c.group for c in configs_], dtype=np.int64)
    c_nodes = np.array([c.nodes for c in configs_], dtype=np.int64)
    c_gpus = np.array([c.gpus for c in configs_], dtype=np.int64)
    num_jobs, width = len(jobs), len(configs_)

    group_of = {name: gi for gi, g in enumerate(groups) for name in g.nodes}
    allowed_type = np.ones((num_jobs, len(groups)), dtype=bool)
    for j, job in enumerate(jobs):
        if job.gpu_types is not None:
            allowed_type[j] = [g.gpu_type in job.gpu_types for g in groups]
    top = np.array(
        [min(job.max_replicas, total, max_nodes * biggest) for job in jobs], dtype=np.int64
    )
    low = np.array([job.min_replicas for job in jobs], dtype=np.int64)
    allowed = allowed_type[:, c_group] & (c_gpus[None, :] <= top[:, None])
    allowed &= c_gpus[None, :] >= low[:, None]

    cur_group = np.full(num_jobs, -1, dtype=np.int64)
    cur_nodes = np.zeros(num_jobs, dtype=np.int64)
    cur_gpus = np.zeros(num_jobs, dtype=np.int64)
    for j, job in enumerate(jobs):
        if not job.allocation:
            continue
        k, spread = len(job.allocation), len(set(job.allocation))
        cur_gpus[j], cur_nodes[j] = k, spread
        held = {group_of[name] for name in job.allocation}
        if len(held) == 1:
            g = held.pop()
            if allowed_type[j, g] and k <= top[j] and (low[j] == 0 or k >= low[j]):
                cur_group[j] = g
    if params.normalisation is Normalisation.FAIR_SHARE:
        ref_nodes, ref_gpus = fair_share(num_jobs, node_count, total)
        scale = node_count / max(total, 1)
    else:
        ref_nodes, ref_gpus, scale = 1, 1, 1.0
    info = _Jobs(allowed, allowed_type, cur_group, cur_nodes, cur_gpus)
    reference = (ref_nodes, ref_gpus, params.normalisation)
    goodput, cur_goodput, base = _goodputs(
        jobs, groups, (c_group, c_nodes, c_gpus), info, reference, tables
    )
    speed = np.full((num_jobs, width + 1), np.nan)
    speed[:, :width] = np.where(allowed & (goodput > 0), goodput / base[:, None], np.nan)
    keep = cur_group >= 0
    speed[keep, width] = cur_goodput[keep] / base[keep]
    speed[keep & ~(cur_goodput > 0), width] = np.nan
    penalty = _restart_factors(state, params.restart_delay)
    u, idle = _utilities(speed, scale, penalty, None, params, width)
    return TypedProblem(
        state=state,
        params=params,
        groups=groups,
        configs=configs_,
        config_group=_frozen(c_group),
        config_nodes=_frozen(c_nodes),
        config_gpus=_frozen(c_gpus),
        speedup=_frozen(speed),
        current_group=_frozen(cur_group),
        current_nodes=_frozen(cur_nodes),
        current_gpus=_frozen(cur_gpus),
        base=_frozen(base),
        scale=scale,
        penalty=_frozen(penalty),
        weight=None,
        utility=u,
        idle=idle,
    )


def _restart_factors(state: ClusterState, delay: float) -> FloatArray:
    """`valuation.restart_factor` of every job, vectorised (the same operations)."""
    if delay <= 0:
        return np.ones(len(state.jobs))
    submitted = np.array([job.submission_time for job in state.jobs], dtype=np.float64)
    restarts = np.array([job.restarts for job in state.jobs], dtype=np.float64)
    age = np.maximum(state.now - submitted, 0.0)
    return np.asarray(np.maximum(age - restarts * delay, 0.0) / (age + delay), dtype=np.float64)


def _utilities(
    speed: FloatArray,
    scale: float,
    penalty: FloatArray,
    weight: FloatArray | None,
    params: PolluxParams,
    stay: int,
) -> tuple[FloatArray, FloatArray]:
    """U (J × (C + 1), −inf where `speed` is NaN) and U0."""
    factor = np.broadcast_to(penalty[:, None], speed.shape).copy()
    factor[:, stay] = 1.0
    ok = ~np.isnan(speed)
    x = scale * np.where(ok, speed, 0.0) * factor + params.epsilon
    u = np.where(ok, utility(x, params.p), -np.inf)
    idle = np.full(speed.shape[0], float(utility(np.array([params.epsilon]), params.p)[0]))
    if weight is not None:
        u = u * weight[:, None]
        idle = idle * weight
    return _frozen(u), _frozen(idle)


@dataclass(frozen=True, slots=True)
class _Jobs:
    """The round's jobs as arrays, for the goodput tables."""

    allowed: BoolArray  # J × C
    allowed_type: BoolArray  # J × G
    cur_group: IntArray
    cur_nodes: IntArray
    cur_gpus: IntArray


@dataclass(slots=True)
class _Block:
    """One group's rows of the round while missing goodputs are filled in."""

    group: int
    store: _Store
    jobs: IntArray  # the round's jobs on this group
    rows: IntArray  # their rows in the store
    table: FloatArray  # jobs × the group's configs
    ref: FloatArray  # jobs × reference sizes
    now: FloatArray  # kept allocation's goodput (NaN: none or missing)
    need: tuple[npt.NDArray[np.intp], ...]
    ref_need: tuple[npt.NDArray[np.intp], ...]
    now_need: npt.NDArray[np.intp]


def _goodputs(
    jobs: tuple[JobInfo, ...],
    groups: tuple[NodeGroup, ...],
    configs_: tuple[IntArray, IntArray, IntArray],
    info: _Jobs,
    reference: tuple[int, int, Normalisation],
    tables: TableCache | None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Goodput of every allowed (job, config), of each kept allocation, and each base."""
    c_group, c_nodes, c_gpus = configs_
    num_jobs, width = info.allowed.shape
    ref_nodes, ref_gpus, normalisation = reference
    if normalisation is not Normalisation.FAIR_SHARE:
        ref_gpus = 1
    ref_k = np.arange(1, ref_gpus + 1)
    ref_n = np.minimum(ref_nodes, ref_k)
    columns = [np.nonzero(c_group == g)[0] for g in range(len(groups))]
    linear = np.array([job.model is None and not job.models for job in jobs], dtype=bool)
    names = [job.name for job in jobs]
    cache = tables if tables is not None else TableCache()
    with cache.lock:
        cache.round += 1
        blocks = []
        for g, group in enumerate(groups):
            on = np.nonzero(info.allowed_type[:, g] & ~linear)[0]
            if not on.size:
                continue
            store = cache.store(group, int(columns[g].size))
            chosen = [jobs[j] for j in on.tolist()]
            kind = group.gpu_type
            models = [job.models.get(kind) or model_for(job, kind) for job in chosen]
            rows = store.rows(
                [names[j] for j in on.tolist()],
                models,  # type: ignore[arg-type]
                cache.round,
                (int(ref_nodes), int(ref_gpus)),
            )
            blocks.append(_block(g, store, on, rows, columns[g], info))
        _compute(blocks, c_nodes, c_gpus, columns, info, (ref_n, ref_k))
        for store in cache.stores.values():
            store.keep(cache.limit)
    goodput = np.zeros((num_jobs, width))
    cur = np.zeros(num_jobs)
    share, weight, best_one = np.zeros(num_jobs), np.zeros(num_jobs), np.zeros(num_jobs)
    for b in blocks:
        goodput[b.jobs[:, None], columns[b.group][None, :]] = np.nan_to_num(b.table, nan=0.0)
        keep = info.cur_group[b.jobs] == b.group
        cur[b.jobs[keep]] = b.now[keep]
        # The largest feasible reference size counts (as in the single-type policy).
        feasible = b.ref > 0
        last = b.ref.shape[1] - 1 - np.argmax(feasible[:, ::-1], axis=1)
        ref = np.where(feasible.any(axis=1), b.ref[np.arange(b.jobs.size), last], 0.0)
        capacity = float(groups[b.group].capacity)
        share[b.jobs] += capacity * ref
        weight[b.jobs] += capacity
        best_one[b.jobs] = np.maximum(best_one[b.jobs], ref)
    base = np.ones(num_jobs)
    if normalisation is Normalisation.FAIR_SHARE:
        modelled = weight > 0
        base[modelled] = share[modelled] / weight[modelled]
    else:
        base = np.where(best_one > 0, best_one, 1.0)
    # Jobs without a model scale linearly: goodput = GPUs, base = the reference GPUs.
    rows = np.nonzero(linear)[0]
    goodput[rows] = np.where(info.allowed[rows], c_gpus[None, :], 0.0)
    cur[rows] = np.where(info.cur_group[rows] >= 0, info.cur_gpus[rows], 0)
    base[rows] = float(ref_gpus)
    return goodput, cur, np.where(base > 0, base, 1.0)


def _block(
    g: int, store: _Store, jobs: IntArray, rows: IntArray, cols: IntArray, info: _Jobs
) -> _Block:
    """Group `g`'s goodputs of `jobs` from the store, and which of them are missing."""
    table = store.values[rows]
    ref = store.ref[rows]
    keep = info.cur_group[jobs] == g
    here = np.stack([info.cur_nodes[jobs], info.cur_gpus[jobs]], axis=1)
    known = keep & (store.cur_key[rows] == here).all(axis=1)
    now = np.where(known, store.cur[rows], np.nan)
    need = np.nonzero(info.allowed[jobs][:, cols] & np.isnan(table))
    return _Block(
        g, store, jobs, rows, table, ref, now, need, np.nonzero(np.isnan(ref)),
        np.nonzero(keep & np.isnan(now))[0],
    )  # fmt: skip


def _compute(
    blocks: list[_Block],
    c_nodes: IntArray,
    c_gpus: IntArray,
    columns: list[IntArray],
    info: _Jobs,
    reference: tuple[IntArray, IntArray],
) -> None:
    """Fill every block's missing goodputs in one evaluation, and store them."""
    ref_n, ref_k = reference
    rows_q: list[IntArray] = []
    nodes_q: list[IntArray] = []
    gpus_q: list[IntArray] = []
    owners: list[GoodputModel] = []  # each block's models that are queried, once each
    index: list[IntArray] = []
    for b in blocks:
        cols = columns[b.group]
        kept = b.jobs[b.now_need]
        rows = np.concatenate([b.rows[b.need[0]], b.rows[b.ref_need[0]], b.rows[b.now_need]])
        nodes_q += [c_nodes[cols[b.need[1]]], ref_n[b.ref_need[1]], info.cur_nodes[kept]]
        gpus_q += [c_gpus[cols[b.need[1]]], ref_k[b.ref_need[1]], info.cur_gpus[kept]]
        used, inverse = np.unique(rows, return_inverse=True)
        index.append(inverse + len(owners))
        owners.extend(b.store.models[r] for r in used.tolist())
        rows_q.append(rows)
    count = sum(r.size for r in rows_q)
    values = np.zeros(0)
    if count:
        values = GoodputModels(owners).best_goodput(
            np.concatenate(index),
            np.concatenate(nodes_q),
            np.concatenate(gpus_q),
            calls=np.arange(count),  # each query alone: values never depend on batching
        )
    offset = 0
    for b in blocks:
        for need, target in ((b.need, b.table), (b.ref_need, b.ref)):
            target[need] = values[offset : offset + need[0].size]
            offset += need[0].size
        b.now[b.now_need] = values[offset : offset + b.now_need.size]
        offset += b.now_need.size
        b.store.values[b.rows] = b.table
        b.store.ref[b.rows] = b.ref
        keep = info.cur_group[b.jobs] == b.group
        rows = b.rows[keep]
        b.store.cur[rows] = b.now[keep]
        b.store.cur_key[rows] = np.stack(
            [info.cur_nodes[b.jobs[keep]], info.cur_gpus[b.jobs[keep]]], axis=1
        )


def _frozen(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    a.flags.writeable = False
    return a
