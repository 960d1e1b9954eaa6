"""Rendering of client values for people (aligned tables) and programs (JSON, YAML).

Pure functions from `pollux.client.types` values to text; the current time comes in as an
argument so that output is reproducible in tests. JSON and YAML are the dataclasses as nested
dicts of their fields (tuples as lists, datetimes as ISO-8601 strings), so scripts see exactly
the public API's names.

Text from the server is someone else's (job output, names, reasons): `escaped` makes every
string of a value safe to print before it is laid out (`pollux.terminal`), `for_terminal`
escapes what is printed as a last line of defence, and JSON and YAML write control characters
as their own escapes, so the data stays the same.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

from pollux.client.types import (
    JOB_STATES,
    Allocation,
    ClusterStatus,
    Explanation,
    Job,
    JobDecision,
    JobEstimate,
    JobSpec,
    NodeStatus,
)
from pollux.terminal import escape_controls

OUTPUT_FORMATS = ("table", "json", "yaml")
NONE = "-"

T = TypeVar("T")


# ---- terminal safety -------------------------------------------------------------------------


def escaped(value: T) -> T:
    """`value` with every string in it (names, reasons, labels, map keys) on one visible line.

    Dataclasses, tuples, lists, mappings and protobuf messages are copied with their strings
    escaped (`pollux.terminal.escape_controls`); numbers, times and None stay as they are.
    """
    result: Any
    if isinstance(value, str):
        result = escape_controls(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields_ = dataclasses.fields(value)
        result = dataclasses.replace(
            value, **{f.name: escaped(getattr(value, f.name)) for f in fields_ if f.init}
        )
    elif isinstance(value, Message):
        result = json_format.ParseDict(escaped(json_format.MessageToDict(value)), type(value)())
    elif isinstance(value, Mapping):
        result = {escaped(k): escaped(v) for k, v in value.items()}
    elif isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        result = type(value)(*(escaped(v) for v in value))
    elif isinstance(value, list | tuple):
        result = type(value)(escaped(v) for v in value)
    else:
        result = value
    return result  # type: ignore[no-any-return]


def for_terminal(text: str, *, raw: bool = False) -> str:
    """`text` ready to print: control characters escaped but tabs and newlines, unless `raw`."""
    return text if raw else escape_controls(text, keep_lines=True)


def _has_controls(text: str) -> bool:
    return for_terminal(text) != text


# ---- machine-readable ------------------------------------------------------------------------


def to_data(value: Any) -> Any:
    """`value` as JSON-compatible data: dataclasses become dicts of their fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): to_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        # NamedTuples (e.g. a watch event) read better as objects.
        if hasattr(value, "_fields"):
            return {k: to_data(v) for k, v in zip(value._fields, value, strict=True)}
        return [to_data(v) for v in value]
    return value


def render_json(value: Any) -> str:
    """Indented JSON of `value`; a control character in a string is written as a JSON escape."""
    data = to_data(value)
    text = json.dumps(data, indent=2, ensure_ascii=False)
    if _has_controls(text):  # only inside strings: JSON escapes them (and all non-ASCII) then
        text = json.dumps(data, indent=2).replace("\x7f", "\\u007f")
    return text


def render_yaml(value: Any) -> str:
    """Block-style YAML of `value`, keys in field order; control characters as YAML escapes."""
    data = to_data(value)
    text: str = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
    if _has_controls(text):  # PyYAML writes bidi controls and NEL raw unless ASCII-only
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    return text.rstrip("\n")


def render_data(value: Any, output: str) -> str:
    """`value` as JSON or YAML, as `output` ("json" or "yaml") asks."""
    if output == "yaml":
        return render_yaml(value)
    return render_json(value)


# ---- building blocks -------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Plain-text table with columns padded to their widest cell (no trailing spaces)."""
    cells = [list(map(str, headers)), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def fields(pairs: Iterable[tuple[str, object]]) -> str:
    """Aligned ``Label:  value`` lines; an empty label continues the line above."""
    items = [(f"{k}:" if k else "", str(v)) for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}".rstrip() for k, v in items)


def timestamp(value: datetime | None) -> str:
    """A time as ``YYYY-MM-DD HH:MM:SSZ`` (UTC), or "-"."""
    if value is None:
        return NONE
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def age(since: datetime | None, now: datetime) -> str:
    """Short elapsed time like ``45s``, ``12m``, ``3h``, ``2d``; "-" when unknown."""
    if since is None:
        return NONE
    seconds = max(int((now - since).total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """``1 GPU``, ``2 GPUs``, ``0 GPUs``: a count with its noun in the right number.

    One helper so that no message says "1 GPUs"; `plural_noun` for irregular plurals
    (``plural(n, "micro-batch", "micro-batches")``).
    """
    return f"{count} {noun if count == 1 else plural_noun or noun + 's'}"


def counted(names: Iterable[str]) -> str:
    """``n1×2, n2`` for a list with repeats, in order of first appearance; "-" when empty."""
    counts = Counter(names)
    return ", ".join(f"{n}×{c}" if c > 1 else n for n, c in counts.items()) or NONE


def allocation_text(allocation: Allocation | None) -> str:
    """``4 GPUs on n1×2, n2×2 (generation 3, round 12, since <time>)``."""
    if allocation is None:
        return "no GPUs"
    return (
        f"{plural(allocation.gpus, 'GPU')} on {counted(allocation.nodes)} "
        f"(generation {allocation.generation}, round {allocation.round}, "
        f"since {timestamp(allocation.time)})"
    )


def _default(value: int, meaning: str) -> str:
    return str(value) if value else f"default ({meaning})"


def _pairs(mapping: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(mapping.items())) or NONE


def batch_limits(spec: JobSpec) -> str:
    """The spec's batch limits with the server's defaults spelled out."""
    top = spec.max_batch_size or spec.initial_batch_size
    low = spec.min_local_batch_size or 1
    high = spec.max_local_batch_size or top
    return f"initial {spec.initial_batch_size}, max {top}, per-GPU {low}..{high}"


# ---- jobs ------------------------------------------------------------------------------------

JOB_HEADERS = (
    "ID",
    "NAME",
    "OWNER",
    "TENANT",
    "STATE",
    "GPUS",
    "NODES",
    "RESTARTS",
    "FAILURES",
    "AGE",
    "ETA",
)


def job_row(job: Job, now: datetime) -> list[object]:
    """One row of `jobs_table`."""
    nodes = job.allocation.node_count if job.allocation else 0
    state = f"{job.state}*" if job.cancel_requested and not job.is_terminal else job.state
    return [
        job.id,
        job.spec.name,
        job.owner or NONE,
        job.tenant or NONE,
        state,
        job.gpus,
        nodes,
        job.restarts,
        job.failures,
        age(job.create_time, now),
        eta(job.estimated_completion, now),
    ]


def eta(when: datetime | None, now: datetime) -> str:
    """Time until a predicted completion, like ``in 12m``; "-" when unknown."""
    if when is None:
        return NONE
    return "due" if when <= now else f"in {age(now, when)}"


def jobs_table(jobs: Iterable[Job], now: datetime) -> str:
    """The `ls` table; a ``*`` after the state marks a pending cancellation."""
    return table(JOB_HEADERS, (job_row(j, now) for j in jobs))


def job_details(job: Job, now: datetime) -> str:
    """The `describe` view: identity, status, spec, allocation and history with reasons."""
    spec = job.spec
    head = [
        ("Job", job.id),
        ("Name", spec.name),
        ("Owner", f"{job.owner or NONE} (tenant {job.tenant or 'default'})"),
        ("State", job.state + (" (cancel requested)" if job.cancel_requested else "")),
        ("Created", f"{timestamp(job.create_time)} ({age(job.create_time, now)} ago)"),
        ("Finished", timestamp(job.finish_time)),
        (
            "Expected end",
            NONE
            if job.estimated_completion is None
            else f"{timestamp(job.estimated_completion)} ({eta(job.estimated_completion, now)}; "
            "declared remaining work ÷ predicted goodput on its current GPUs)",
        ),
        ("Request id", job.request_id or NONE),
        ("Restarts", job.restarts),
        ("Failures", f"{job.failures} (tolerates {spec.max_failures or 3})"),
        ("Allocation", allocation_text(job.allocation)),
        ("GPU time", f"{job.attained_gpu_seconds / 3600:.2f} GPU-hours"),
        ("Command", shlex.join(spec.command) or NONE),
        ("Working dir", spec.working_dir or NONE),
        ("Image", spec.image or NONE),
        ("Batch", batch_limits(spec)),
        ("Scaling rule", spec.scaling_rule),
        ("Max replicas", spec.max_replicas or "no limit"),
        ("Stop grace", _default(spec.stop_grace_s, "30 s")),
        ("Env", _pairs(spec.env)),
        ("Secret env", ", ".join(sorted(spec.secret_env)) or NONE),
        ("Labels", _pairs(spec.labels)),
    ]
    if spec.image:
        head[head.index(("Image", spec.image)) + 1 : 0] = [
            ("Shm size", f"{spec.shm_size_mb} MiB" if spec.shm_size_mb else "runtime default"),
            ("Mounts", ", ".join(map(str, spec.mounts)) or NONE),
        ]
    history = table(
        ("TIME", "STATE", "REASON"),
        ((timestamp(t.time), t.state, t.reason or NONE) for t in job.history),
    )
    indented = "\n".join(f"  {line}" for line in history.splitlines())
    return f"{fields(head)}\nHistory:\n{indented}"


def submitted_text(job: Job) -> str:
    """What `submit` prints: the id first, so ``$(pollux-cli submit ... | cut -f1)`` works."""
    return f"{job.id}\t{job.spec.name}\t{job.state}"


def estimate_text(found: JobEstimate, now: datetime) -> str:
    """What `estimate` prints: the predicted JCT, the completion time, what it assumed."""
    return fields(
        [
            ("Predicted JCT", f"{_duration(found.predicted_jct_s)} (if submitted now)"),
            ("Completion", timestamp(found.predicted_completion)),
            (
                "Assumes",
                f"the goodput model and size ({found.work:.1f} M0-steps) of "
                f"{found.reference_job_id}, no further arrivals",
            ),
            ("Forecast", f"{plural(found.rounds, 'round')} of the policy"),
        ]
    )


def _duration(seconds: float) -> str:
    minutes, secs = divmod(max(round(seconds), 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


# ---- explain ---------------------------------------------------------------------------------


def explanation_text(explanation: Explanation) -> str:
    """The `explain` view: decision, round, batch configuration and model."""
    job = explanation.job
    pairs: list[tuple[str, object]] = [
        ("Job", f"{job.id} ({job.spec.name}) {job.state}"),
        ("Holds", allocation_text(job.allocation)),
    ]
    decision, info = explanation.decision, explanation.round
    if decision is None:
        pairs.append(("Decision", "none yet: the job has not been in a scheduling round"))
    else:
        chosen = len(decision.nodes)
        change = "changed this round" if decision.changed else "unchanged"
        pairs += [
            ("Chosen", f"{plural(chosen, 'GPU')} on {counted(decision.nodes)}"),
            ("Change", change),
            ("Speedup", f"{decision.speedup:.3f}{_speedup_basis(decision)}"),
            *_speedup_history(explanation),
            ("Restart penalty", f"{decision.restart_penalty:.3f}"),
            *_move_factor_pairs(decision),
            ("Reason", decision.reason or NONE),
        ]
    if info is not None:
        pairs.append(
            (
                "Round",
                f"{info.round} at {timestamp(info.time)} by {info.scheduler_id or NONE} "
                f"({'placement round, ' if info.placement else ''}"
                f"policy {info.policy or NONE}, objective {info.objective:.4g}, "
                f"etcd revision {info.snapshot_revision})",
            )
        )
    batch = explanation.batch
    if batch is None:
        pairs.append(("Batch", "not modelled yet"))
    else:
        pairs.append(
            (
                "Batch",
                f"{batch.local_batch_size} per GPU × {plural(batch.accum_steps, 'step')} "
                f"= total {batch.total_batch_size} "
                f"(predicted speedup {batch.predicted_speedup:.3f})",
            )
        )
    pairs += _model_pairs(explanation)
    pairs += _counterfactual_pairs(explanation)
    text = fields(pairs)
    if explanation.alternatives:
        held = len(job.allocation.nodes) if job.allocation is not None else 0
        rows = [
            [
                f"{a.gpus}{' (now)' if a.gpus == held else ''}",
                a.nodes,
                f"{a.speedup:.3f}",
                f"{a.goodput:.1f}" if a.goodput else NONE,
            ]
            for a in explanation.alternatives
        ]
        headers = ["GPUS", "NODES", "SPEEDUP (× fair-share goodput)", "GOODPUT (samples/s)"]
        text += "\n\nWith other GPU counts (predicted now):\n" + table(headers, rows)
    return text


def _counterfactual_pairs(explanation: Explanation) -> list[tuple[str, object]]:
    """Explain's counterfactual lines: last change, queue, batch choice, where GPUs are."""
    pairs: list[tuple[str, object]] = []
    change = explanation.last_change
    if change is not None:
        pairs.append(
            ("Last change", f"{timestamp(change.time)} {change.state}: {change.reason or NONE}")
        )
    if explanation.queue_position:
        pairs.append(
            (
                "Queue",
                f"{_ordinal(explanation.queue_position)} of "
                f"{plural(explanation.pending_jobs, 'pending job')} (by submission time)",
            )
        )
    choice = explanation.batch_choice
    if choice is not None:
        steps = choice.accum_steps + 1
        pairs.append(
            (
                "Batch choice",
                f"total {choice.batch_size} samples ({choice.local_batch_size} per GPU × "
                f"{plural(steps, 'micro-batch', 'micro-batches')}): throughput "
                f"{choice.throughput:.1f} samples/s × efficiency {choice.efficiency:.3f} = "
                f"goodput {choice.goodput:.1f} samples/s",
            )
        )
    pairs += _gpu_market(explanation)
    return pairs


def _speedup_basis(decision: JobDecision) -> str:
    """`` × its goodput on its fair share (1 GPU on 1 node), by its model of …``."""
    basis = ""
    if decision.reference_gpus:
        ref = f"{plural(decision.reference_gpus, 'GPU')} on "
        basis = (
            f" × its goodput on its fair share ({ref}{plural(decision.reference_nodes, 'node')})"
        )
    if decision.model_time is not None:
        return f"{basis}, by its model of {timestamp(decision.model_time)}"
    if decision.reference_gpus:
        return f"{basis}, with no model yet (linear scaling assumed)"
    return basis


def _speedup_history(explanation: Explanation) -> list[tuple[str, object]]:
    """What the policy predicted of this allocation when it chose it, and what changed since.

    A speedup is relative to the job's fair share and predicted by its model: the same
    allocation reads 1.000 before the first fit and 0.516 after it, so both are shown with
    the change that moved one to the other.
    """
    then, now, chosen = (
        explanation.allocation_decision,
        explanation.decision,
        explanation.allocation_round,
    )
    if then is None or now is None or abs(then.speedup - now.speedup) < 5e-4:
        return []
    when = (
        f"round {chosen.round} at {timestamp(chosen.time)}" if chosen is not None else "the round"
    )
    changes = []
    if then.model_time != now.model_time:
        if then.model_time is None:
            changes.append(
                f"its model was first fitted ({timestamp(now.model_time)}; until then linear "
                "scaling was assumed)"
            )
        elif now.model_time is None:
            changes.append("its model is gone (linear scaling assumed again)")
        else:
            changes.append(
                f"its model was refitted ({timestamp(then.model_time)} → "
                f"{timestamp(now.model_time)}: throughput and gradient noise, and so the batch "
                "size it picks)"
            )
    if (then.reference_gpus, then.reference_nodes) != (now.reference_gpus, now.reference_nodes):
        changes.append(
            f"its fair share changed ({plural(then.reference_gpus, 'GPU')} → "
            f"{plural(now.reference_gpus, 'GPU')}: jobs arrived or finished)"
        )
    why = "; ".join(changes) or "no change of its model or fair share was recorded"
    return [("Speedup then", f"{then.speedup:.3f} when {when} chose this allocation; since: {why}")]


def _move_factor_pairs(decision: JobDecision) -> list[tuple[str, object]]:
    if decision.move_factor is None:
        return []
    return [
        (
            "Restart factor",
            f"{decision.move_factor:.3f}: a re-allocation stops and restarts the job, so a new "
            "allocation's speedup counted × this in the round (it grows as the job runs "
            "without a restart)",
        )
    ]


_BUDGET = re.compile(r"\(tenant ([^:]*): (\d+) of its (\d+)-GPU budget\)")


def why_not_one_more(explanation: Explanation) -> str:
    """Why the last round did not give the job one more GPU, from its decision record.

    The rules that hold a job back, in the order the policy applies them: its GPU limit
    (max_replicas, the exploration limit), the restart factor (a move must pay for its
    restart), its tenant's budget, no idle GPU (one would be taken from another job only
    where that raises the objective), a placement round. "" when the record does not say
    (no decision, a pending job, a job the round moved, a server that does not record it).
    """
    d, info = explanation.decision, explanation.round
    held = len(d.nodes) if d is not None else 0
    if d is None or held == 0 or d.changed:
        return ""
    if d.gpu_limit and held >= d.gpu_limit:
        return f"{plural(held, 'GPU')} is its limit this round: {_limit_text(explanation, held)}"
    if d.speedup_one_more is None or d.move_factor is None:
        return ""
    more, factor, kept = d.speedup_one_more, d.move_factor, d.speedup
    valued = (
        f"{held + 1} GPUs at speedup {more:.3f} × restart factor {factor:.3f} = {more * factor:.3f}"
    )
    if more * factor <= kept:
        pays = f"; it pays once the factor exceeds {kept / more:.3f}" if more > kept > 0 else ""
        return (
            f"the restart would cost more than the GPU gains: the round valued {valued}, no "
            f"more than the {kept:.3f} it has unchanged{pays} (the factor grows as the job "
            "runs without a restart)"
        )
    budget = _BUDGET.search(d.reason)
    if budget is not None and int(budget.group(2)) >= int(budget.group(3)):
        return f"its tenant {budget.group(1)} holds its whole {budget.group(3)}-GPU budget"
    idle = info.idle_gpus if info is not None else 0
    if info is not None and info.placement:
        return (
            "the round was a placement round, which only starts new jobs on free GPUs; the "
            "next full round weighs growing this one"
        )
    if idle == 0:
        return (
            f"no GPU was idle: the round valued {valued}, but a GPU would have to come from "
            "another job, and the policy moves one only where it raises its objective (the "
            "cheapest GPUs below)"
        )
    return (
        f"{plural(idle, 'GPU')} idle and the round valued {valued}, above the {kept:.3f} it "
        f"has; but {held + 1} GPUs were valued on the fewest nodes, and the idle GPUs are "
        "elsewhere: spanning more nodes is slower, and no node takes two distributed jobs"
    )


def _limit_text(explanation: Explanation, held: int) -> str:
    spec, model = explanation.job.spec, explanation.model
    if spec.max_replicas and held >= spec.max_replicas:
        return "its max_replicas"
    if model is not None and model.max_profiled_replicas:
        return (
            f"it has been measured on up to {plural(model.max_profiled_replicas, 'replica')}, "
            "and a job may grow only a few-fold past what it has measured (the exploration "
            "limit), so that its model is not trusted far beyond its measurements"
        )
    return "the cluster's GPUs (or the nodes one job may span)"


def _gpu_market(explanation: Explanation) -> list[tuple[str, object]]:
    """One more GPU for this job against what the cheapest held GPUs are worth elsewhere."""
    job = explanation.job
    held = len(job.allocation.nodes) if job.allocation is not None else 0
    speed = {a.gpus: a.speedup for a in explanation.alternatives}
    pairs: list[tuple[str, object]] = []
    if held + 1 in speed:
        gain = speed[held + 1] - speed.get(held, 0.0)
        pairs.append(
            (
                "One more GPU",
                f"+{gain:.3f} speedup for this job ({held} → {plural(held + 1, 'GPU')}), "
                "predicted now",
            )
        )
    why = why_not_one_more(explanation)
    if why:
        pairs.append(("Not given", why))
    for index, h in enumerate(explanation.holders):
        who = f"{h.name} ({h.job_id})" if h.name else h.job_id
        pairs.append(
            (
                "Cheapest GPUs" if index == 0 else "",
                f"{who}: its last of {plural(h.gpus, 'GPU')} is worth "
                f"{h.last_gpu_worth:.3f} speedup to it ({h.speedup:.3f} → "
                f"{h.speedup_without_one:.3f})",
            )
        )
    if explanation.holders and held + 1 in speed:
        objective = f" ({explanation.objective})" if explanation.objective else ""
        pairs.append(("", f"the policy moves a GPU only where it raises its objective{objective}"))
    return pairs


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _model_pairs(explanation: Explanation) -> list[tuple[str, object]]:
    model = explanation.model
    if model is None:
        return [("Model", "none published yet")]
    pairs: list[tuple[str, object]] = [
        (
            "Model",
            f"by {model.agent_id or NONE} from {plural(model.observations, 'observation')}, "
            f"profiled up to {plural(model.max_profiled_replicas, 'replica')}, "
            f"updated {timestamp(model.update_time)}",
        ),
        *([("Seeded from", model.seeded_from)] if model.seeded_from else []),
        ("Gradient", f"sqr {model.grad_sqr:.4g}, var {model.grad_var:.4g}"),
        (
            "Batch limits",
            f"initial {model.initial_batch_size}, max {model.max_batch_size}, "
            f"per-GPU {model.min_local_batch_size}..{model.max_local_batch_size}",
        ),
    ]
    if model.progress is not None:
        left = (
            "no size declared"
            if model.remaining_work is None
            else f"{model.remaining_work:.1f} M0-steps declared left"
        )
        pause = (
            ""
            if model.rescale_pause_s is None
            else f"; last rescale pause {model.rescale_pause_s:.1f} s (SIGTERM to first step)"
        )
        pairs.append(("Work", f"{model.progress:.1f} M0-steps done, {left}{pause}"))
    t = model.throughput
    if t is None:
        pairs.append(("Throughput", "not fitted yet"))
    else:
        pairs.append(
            (
                "Throughput",
                f"alpha_c {t.alpha_c:.4g}s beta_c {t.beta_c:.4g}s "
                f"alpha_n {t.alpha_n:.4g}s beta_n {t.beta_n:.4g}s "
                f"alpha_r {t.alpha_r:.4g}s beta_r {t.beta_r:.4g}s "
                f"gamma {t.gamma:.4g} ({t.sync_model} sync)",
            )
        )
    return pairs


# ---- cluster ---------------------------------------------------------------------------------

NODE_HEADERS = ("NODE", "GPUS", "FREE", "TYPE", "ADDRESS", "JOBS")
OTHERS = "other users'"
"""What `nodes` shows for GPUs held by jobs the caller may not see (the server names none)."""


def node_row(node: NodeStatus) -> list[object]:
    """One row of `nodes_table`."""
    return [
        node.name,
        f"{node.allocated_gpus}/{node.gpus}",
        node.free_gpus,
        node.gpu_type or NONE,
        node.address or NONE,
        counted(job or OTHERS for job in node.jobs),
    ]


def nodes_table(cluster: ClusterStatus) -> str:
    """The `nodes` table: GPUs used/total and the jobs on each node (after any warnings)."""
    return warning_lines(cluster) + table(NODE_HEADERS, (node_row(n) for n in cluster.nodes))


def warning_lines(cluster: ClusterStatus) -> str:
    """The cluster's warnings (etcd out of space), one "WARNING:" line each, or nothing."""
    return "".join(f"WARNING: {w}\n" for w in cluster.warnings)


def _state_key(name: str) -> tuple[int, str]:
    short = name.removeprefix("JOB_STATE_")
    return (JOB_STATES.index(short) if short in JOB_STATES else len(JOB_STATES), short)


def cluster_summary(cluster: ClusterStatus) -> str:
    """Two lines: leader, round and GPU use; then jobs per state (after any warnings)."""
    leader = f"{cluster.leader_id} ({cluster.leader_address})" if cluster.leader_id else "none (!)"
    first = (
        f"leader {leader}  round {cluster.last_round}  "
        f"GPUs {cluster.allocated_gpus}/{cluster.total_gpus} used  "
        f"nodes {len(cluster.nodes)}  agents {len(cluster.agents)}"
    )
    states = sorted(cluster.jobs_by_state.items(), key=lambda kv: _state_key(kv[0]))
    second = "jobs " + (
        "  ".join(f"{name.removeprefix('JOB_STATE_')} {n}" for name, n in states if n) or "none"
    )
    return f"{warning_lines(cluster)}{first}\n{second}"


def top_text(cluster: ClusterStatus, jobs: Sequence[Job], now: datetime) -> str:
    """The `top` screen: summary, nodes, then the jobs that have not finished."""
    active = [j for j in jobs if not j.is_terminal]
    return f"{cluster_summary(cluster)}\n\n{nodes_table(cluster)}\n\n{jobs_table(active, now)}"
