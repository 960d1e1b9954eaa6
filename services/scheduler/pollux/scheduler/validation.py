"""Complete validation of a submitted job, before anything is stored.

Every problem is reported at once, with the field path and what to do about it; the servicer
turns the list into INVALID_ARGUMENT with a google.rpc.BadRequest detail. Input is bounded
everywhere: the whole spec by `MAX_SPEC_BYTES` (so that a round's transaction, which carries
many job records, stays far below etcd's request limit), every string by the characters it may
hold (no NUL, which no process can receive, and no control characters outside free text), and
enums by their known values. Regexes match whole strings (``fullmatch``: ``$`` would accept a
trailing newline), and messages quote user input only cut short (`errors.shown`).
"""

from __future__ import annotations

import re

from pollux.service.errors import Violations, shown
from pollux.v1 import types_pb2 as pb

NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")
ID_LIKE_NAME = re.compile(r"j-[0-9a-f]{0,10}|[0-9a-f]{1,10}")
"""Names a job reference would read as a job id or id prefix (ids are ``j-`` + 10 hex digits;
a reference matches ids and id prefixes, with or without ``j-``, before names)."""
REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
LABEL_KEY = re.compile(r"[A-Za-z0-9._/-]{1,63}")
MAX_BATCH = 1 << 24
MAX_SPEC_BYTES = 64 * 1024
"""Serialized JobSpec size limit: etcd takes 1.5 MiB per request, a round commits many jobs."""
MAX_COMMAND_BYTES = 32 * 1024
MAX_ENV = 512
MAX_LABELS = 64
MAX_LABEL_VALUE = 256
MAX_PATH = 4096
MAX_IMAGE = 512
"""Longest image reference (registries allow 255-character names plus tag and digest)."""
MAX_MOUNTS = 32
MAX_SHM_MB = 1 << 20
"""1 TiB of /dev/shm: more than any node has, so only a typo is refused."""
IMAGE = re.compile(
    r"(?:(?P<registry>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?)/)?"
    r"(?P<name>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@sha256:(?P<digest>[a-f0-9]{64}))?"
)
"""``[registry[:port]/]name[:tag][@sha256:<64 hex>]``, after the OCI distribution spec's
grammar: a first component with a dot, a colon or ``localhost`` is a registry only because
the runtime reads it so; the regex accepts both readings, which name the same string."""
MOUNT_PATH = re.compile(r"/[^:,]*")
"""An absolute path without ':' or ',' (the runtimes' -v and --mount syntaxes split on them);
control characters are refused before this is matched."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
"""Control characters, except tab and newline (allowed in arguments and values)."""


_PLAIN_KEY = re.compile(r"[A-Za-z0-9._/-]{1,64}")


def _key_path(prefix: str, key: str) -> str:
    """``spec.env[NAME]`` for a plain key; a key that is not plain is quoted and cut."""
    return f"{prefix}[{key}]" if _PLAIN_KEY.fullmatch(key) else f"{prefix}[{shown(key, 40)}]"


def _text(v: Violations, field: str, value: str, *, free_text: bool = False) -> None:
    """Refuse NUL anywhere and other control characters outside free text."""
    if "\x00" in value:
        v.add(field, "contains a NUL byte, which no process can receive")
    elif (_CONTROL_BUT_TEXT if free_text else _CONTROL).search(value):
        allowed = " (tab and newline are allowed)" if free_text else ""
        v.add(field, f"contains a control character{allowed}")


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
    size = spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        v.add("spec", f"{size} bytes serialized; at most {MAX_SPEC_BYTES} (trim env, labels)")
    v.check(
        NAME.fullmatch(spec.name) is not None,
        "spec.name",
        f"{shown(spec.name)} must be 1-63 characters of [a-z0-9-] starting with a letter",
    )
    v.check(
        ID_LIKE_NAME.fullmatch(spec.name) is None,
        "spec.name",
        f"{shown(spec.name)} reads as a job id or id prefix (ids are j- and 10 hex digits), "
        "and a job reference means an id before a name: pick a name with a letter beyond f "
        f"or more than 10 characters (e.g. run-{spec.name})",
    )
    _validate_command(spec, v)
    _validate_env(spec, v)
    if len(spec.working_dir) > MAX_PATH:
        v.add("spec.working_dir", f"longer than {MAX_PATH} characters")
    _text(v, "spec.working_dir", spec.working_dir)
    _validate_batch(spec.batch, v)
    v.check(
        spec.scaling_rule in pb.ScalingRule.values(),
        "spec.scaling_rule",
        f"{spec.scaling_rule} is not a scaling rule (ADASCALE, LINEAR, SQRT or NONE)",
    )
    v.check(spec.max_replicas <= 4096, "spec.max_replicas", "must be at most 4096 (0 = no limit)")
    v.check(spec.max_failures <= 1000, "spec.max_failures", "must be at most 1000")
    v.check(spec.stop_grace_s <= 3600, "spec.stop_grace_s", "must be at most 3600 seconds")
    _validate_labels(spec, v)
    _validate_container(spec, v)
    v.raise_if_any()


def _validate_command(spec: pb.JobSpec, v: Violations) -> None:
    v.check(len(spec.command) > 0, "spec.command", "must have at least the program to run")
    if spec.command and not spec.command[0]:
        v.add("spec.command[0]", "the program must not be empty")
    if sum(len(a) for a in spec.command) > MAX_COMMAND_BYTES:
        v.add("spec.command", f"longer than {MAX_COMMAND_BYTES} characters in all")
    for i, arg in enumerate(spec.command):
        _text(v, f"spec.command[{i}]", arg, free_text=i > 0)


def _validate_env(spec: pb.JobSpec, v: Violations) -> None:
    if len(spec.env) + len(spec.secret_env) > MAX_ENV:
        v.add("spec.env", f"{len(spec.env) + len(spec.secret_env)} variables; at most {MAX_ENV}")
    for where, env in (("spec.env", spec.env), ("spec.secret_env", spec.secret_env)):
        for name, value in env.items():
            field = _key_path(where, name)
            if ENV_NAME.fullmatch(name) is None:
                v.add(field, "not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            elif name.startswith("POLLUX_"):
                v.add(field, "POLLUX_* variables are set by the launcher; rename it")
            _text(v, field, value, free_text=True)
    for name in set(spec.env) & set(spec.secret_env):
        v.add(_key_path("spec.secret_env", name), "also in spec.env; keep it in one of them")


def _validate_labels(spec: pb.JobSpec, v: Violations) -> None:
    if len(spec.labels) > MAX_LABELS:
        v.add("spec.labels", f"{len(spec.labels)} labels; at most {MAX_LABELS}")
    for key, value in spec.labels.items():
        field = _key_path("spec.labels", key)
        if LABEL_KEY.fullmatch(key) is None:
            v.add(field, "label keys must be 1-63 characters of [A-Za-z0-9._/-]")
        if len(value) > MAX_LABEL_VALUE:
            v.add(field, f"the value is longer than {MAX_LABEL_VALUE} characters")
        _text(v, field, value)


def _validate_container(spec: pb.JobSpec, v: Violations) -> None:
    """The image reference's syntax, the shm size, and each mount's two paths.

    Whether a node may mount a host path is the launcher's decision (its
    ``container_mounts_allowed``); the API only makes sure what it stores is well formed.
    """
    image = spec.image
    if image:
        if len(image) > MAX_IMAGE:
            v.add("spec.image", f"longer than {MAX_IMAGE} characters")
        elif IMAGE.fullmatch(image) is None:
            v.add(
                "spec.image",
                f"{shown(image)} is not an image reference [registry[:port]/]name[:tag]"
                "[@sha256:<64 hex digits>] (name in lowercase, e.g. ghcr.io/org/train:1.2)",
            )
    elif spec.shm_size_mb or spec.mounts:
        field = "spec.shm_size_mb" if spec.shm_size_mb else "spec.mounts"
        v.add(field, "only applies to a container: set spec.image too, or leave it unset")
    v.check(spec.shm_size_mb <= MAX_SHM_MB, "spec.shm_size_mb", f"must be at most {MAX_SHM_MB}")
    if len(spec.mounts) > MAX_MOUNTS:
        v.add("spec.mounts", f"{len(spec.mounts)} mounts; at most {MAX_MOUNTS}")
    targets: set[str] = set()
    for i, mount in enumerate(spec.mounts[:MAX_MOUNTS]):
        _mount_path(v, f"spec.mounts[{i}].host_path", mount.host_path)
        _mount_path(v, f"spec.mounts[{i}].container_path", mount.container_path)
        if mount.container_path.strip("/") == "" and mount.container_path:
            v.add(
                f"spec.mounts[{i}].container_path",
                "cannot mount over the container's root: name a directory in it",
            )
        if mount.container_path in targets:
            v.add(f"spec.mounts[{i}].container_path", "mounted twice: keep one entry")
        targets.add(mount.container_path)


def _mount_path(v: Violations, field: str, path: str) -> None:
    if len(path) > MAX_PATH:
        v.add(field, f"longer than {MAX_PATH} characters")
    elif _CONTROL.search(path):
        _text(v, field, path)
    elif MOUNT_PATH.fullmatch(path) is None:
        v.add(field, f"{shown(path)} must be an absolute path without ':' or ','")
    elif "/../" in f"{path}/" or "/./" in f"{path}/":
        v.add(field, f"{shown(path)} has '.' or '..' components: give the plain path")


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
