"""Complete validation of a submitted job, before anything is stored.

The rules of a spec are the job-spec contract's (`pollux.jobspec`), which the client applies
to a job file before sending: this module adds only what belongs to the request (its id, the
spec's presence and serialized size) and names each field by its API path. Every problem is
reported at once, with the field path and what to do about it; the servicer turns the list
into INVALID_ARGUMENT with a google.rpc.BadRequest detail. Input is bounded everywhere: the
whole spec by `MAX_SPEC_BYTES` (so that a round's transaction, which carries many job records,
stays far below etcd's request limit), every string by the characters it may hold, enums by
their known values.
"""

from __future__ import annotations

import re

from pollux import jobspec
from pollux.jobspec import wire
from pollux.service.errors import Violations
from pollux.v1 import types_pb2 as pb

REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
MAX_SPEC_BYTES = jobspec.MAX_SPEC_BYTES


def validate_submit(spec: pb.JobSpec, request_id: str, has_spec: bool) -> None:
    """Raise `InvalidArgument` listing every problem of a SubmitJob request."""
    v = Violations()
    v.check(
        REQUEST_ID.fullmatch(request_id) is not None,
        "request_id",
        "must be 1-128 characters of [A-Za-z0-9._-] (the CLI sends a UUID)",
    )
    if not has_spec:
        v.add("spec", "missing: a job needs at least spec.name and spec.command")
        v.raise_if_any()
    if too_large := jobspec.spec_size_problem(spec.ByteSize()):
        v.add("spec", too_large)
    for found in jobspec.check(wire.values_of(spec)):
        v.add(found.api_path, found.problem)
    v.raise_if_any()


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
