"""Complete validation of a submitted job, before anything is stored.

Every problem is reported at once, with the field path and what to do about it; the servicer
turns the list into INVALID_ARGUMENT with a google.rpc.BadRequest detail.
"""

from __future__ import annotations

import re

from pollux.service.errors import Violations
from pollux.v1 import types_pb2 as pb

NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_BATCH = 1 << 24
MAX_COMMAND_BYTES = 64 * 1024


def validate_submit(spec: pb.JobSpec, request_id: str, has_spec: bool) -> None:
    """Raise `InvalidArgument` listing every problem of a SubmitJob request."""
    v = Violations()
    v.check(
        bool(REQUEST_ID.match(request_id)),
        "request_id",
        "must be 1-128 characters of [A-Za-z0-9._-] (the CLI sends a UUID)",
    )
    if not has_spec:
        v.add("spec", "missing: a job needs at least spec.name and spec.command")
        v.raise_if_any()
    v.check(
        bool(NAME.match(spec.name)),
        "spec.name",
        f"{spec.name!r} must be 1-63 characters of [a-z0-9-] starting with a letter",
    )
    v.check(len(spec.command) > 0, "spec.command", "must have at least the program to run")
    if spec.command and not spec.command[0]:
        v.add("spec.command[0]", "the program must not be empty")
    if sum(len(a) for a in spec.command) > MAX_COMMAND_BYTES:
        v.add("spec.command", f"longer than {MAX_COMMAND_BYTES} bytes")
    for name in spec.env:
        if not ENV_NAME.match(name):
            v.add(f"spec.env[{name}]", "not a valid environment variable name")
        elif name.startswith("POLLUX_"):
            v.add(f"spec.env[{name}]", "POLLUX_* variables are set by the launcher; rename it")
    _validate_batch(spec.batch, v)
    v.check(spec.max_replicas <= 4096, "spec.max_replicas", "must be at most 4096 (0 = no limit)")
    v.check(spec.max_failures <= 1000, "spec.max_failures", "must be at most 1000")
    v.check(spec.stop_grace_s <= 3600, "spec.stop_grace_s", "must be at most 3600 seconds")
    for key in spec.labels:
        if not key or len(key) > 63:
            v.add(f"spec.labels[{key}]", "label keys must be 1-63 characters")
    v.raise_if_any()


def _validate_batch(batch: pb.BatchLimits, v: Violations) -> None:
    m0 = batch.initial_batch_size
    v.check(
        m0 >= 1, "spec.batch.initial_batch_size", "must be >= 1 (the batch your LR is tuned for)"
    )
    v.check(m0 <= MAX_BATCH, "spec.batch.initial_batch_size", f"must be <= {MAX_BATCH}")
    top = batch.max_batch_size or m0
    if batch.max_batch_size and batch.max_batch_size < m0:
        v.add(
            "spec.batch.max_batch_size",
            f"{batch.max_batch_size} is below initial_batch_size {m0}: raise it or leave it 0",
        )
    v.check(top <= MAX_BATCH, "spec.batch.max_batch_size", f"must be <= {MAX_BATCH}")
    lo = batch.min_local_batch_size or 1
    hi = batch.max_local_batch_size or top
    if lo > hi:
        v.add(
            "spec.batch.min_local_batch_size",
            f"{lo} exceeds max_local_batch_size {hi}",
        )
    if lo > top:
        v.add("spec.batch.min_local_batch_size", f"{lo} exceeds the largest total batch {top}")


def normalised(spec: pb.JobSpec) -> pb.JobSpec:
    """The spec with defaults made explicit, as stored."""
    out = pb.JobSpec()
    out.CopyFrom(spec)
    if not out.batch.max_batch_size:
        out.batch.max_batch_size = out.batch.initial_batch_size
    if not out.batch.min_local_batch_size:
        out.batch.min_local_batch_size = 1
    if not out.batch.max_local_batch_size:
        out.batch.max_local_batch_size = out.batch.max_batch_size
    if not out.max_failures:
        out.max_failures = 3
    if out.scaling_rule == pb.SCALING_RULE_UNSPECIFIED:
        out.scaling_rule = pb.SCALING_RULE_ADASCALE
    return out
