"""The job-spec contract: every rule a job's spec keeps, defined once.

`FIELDS` is the table of job-file keys, each also a field of the API's ``JobSpec``
(`Field.api_path`): its type, default, bounds, pattern and what a violation says to fix.
`check` applies the table and the rules across keys (batch limits, env against secret_env,
container-only keys) to plain values and returns every problem, each naming its key. The
scheduler runs it on every SubmitJob (`pollux.scheduler.validation`) and the client on every
job file and set of flags before sending (`pollux.client.types`), so both refuse the same specs
with the same words. docs/job-file.md documents each key; a unit test holds it to this table.
`pollux.jobspec.wire` moves the values to and from the ``pollux.v1.JobSpec`` message.

Values are plain Python (`str`, `int`, sequences of `str`, maps of `str`, `Mount`-likes). A
key absent from the values is not checked, nor any rule across keys that reads it. Regexes
match whole strings (``fullmatch``: ``$`` would accept a trailing newline).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pollux.terminal import quoted

MAX_SPEC_BYTES = 64 * 1024
"""Serialized JobSpec size limit: etcd takes 1.5 MiB per request, a round commits many jobs."""
MAX_BATCH = 1 << 24
"""Largest batch size of any kind (16 Mi samples)."""
MAX_PATH = 4096
"""Longest path: working_dir and each side of a mount."""
MAX_ENV = 512
"""Most environment variables, env and secret_env together."""

NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")
ID_LIKE_NAME = re.compile(r"j-[0-9a-f]{0,10}|[0-9a-f]{1,10}")
"""Names a job reference would read as a job id or id prefix (ids are ``j-`` + 10 hex digits;
a reference matches ids and id prefixes, with or without ``j-``, before names)."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
LABEL_KEY = re.compile(r"[A-Za-z0-9._/-]{1,63}")
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
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
"""Control characters, except tab and newline (allowed in arguments and values)."""
_PLAIN_ENTRY = re.compile(r"[A-Za-z0-9._/-]{1,64}")
"""A map entry's name written as it is in a field path; any other is quoted."""


class Kind(enum.Enum):
    """The type of a key's value; the value is how docs/job-file.md names it."""

    TEXT = "string"
    ARGV = "list of strings"
    COUNT = "whole number"
    CHOICE = "one of"
    NAMES = "mapping of strings"
    MOUNTS = "list of mounts"


@dataclass(frozen=True)
class Field:
    """One job-file key and the rules its value keeps by itself."""

    key: str
    """The job-file key; the CLI flag is the key with dashes."""
    kind: Kind
    summary: str
    """What it is, in one short line (flag help, the reference's table)."""
    api_path: str
    """Its field in the API: ``spec.batch.initial_batch_size``."""
    default: str = ""
    """What leaving it out (or 0, or empty) means; "" for a required key."""
    required: bool = False
    least: int = 0
    """COUNT: smallest value."""
    most: int = 0
    """COUNT: largest value."""
    range_note: str = ""
    """COUNT: said after the range when a value is outside it."""
    max_chars: int = 0
    """TEXT: longest value; ARGV: most characters in all; NAMES: longest value of an entry."""
    max_entries: int = 0
    """NAMES and MOUNTS: most entries (0: bounded only across keys or by the spec's size)."""
    pattern: re.Pattern[str] | None = None
    """TEXT: what a non-empty (or required) value matches; NAMES: what each name matches."""
    pattern_says: str = ""
    """What a value that does not match must be, after the value (TEXT) or alone (NAMES)."""
    lines: bool = False
    """Tab and newline are allowed (free text); other control characters never are."""
    reserved_prefix: str = ""
    """NAMES: a prefix no name may have."""
    choices: tuple[str, ...] = ()
    """CHOICE: the values allowed ("" is the default)."""
    also: Callable[[Any], str | None] | None = None
    """A further rule of the value alone, applied after the others: the problem or None."""

    @property
    def api_parts(self) -> tuple[str, ...]:
        """The attribute path of the field in a ``JobSpec`` message: ``("batch", "name")``."""
        return tuple(self.api_path.removeprefix("spec.").split("."))


def _not_an_id(name: str) -> str | None:
    """A job reference means an id or id prefix before a name: a name must not read as one."""
    if not ID_LIKE_NAME.fullmatch(name):
        return None
    return (
        f"{quoted(name)} reads as a job id or id prefix (ids are j- and 10 hex digits), "
        "and a job reference means an id before a name: pick a name with a letter beyond f "
        f"or more than 10 characters (e.g. run-{name})"
    )


_ENV = Field(
    "env",
    Kind.NAMES,
    "environment of every replica",
    "spec.env",
    default="none",
    pattern=ENV_NAME,
    pattern_says="not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
    lines=True,
    reserved_prefix="POLLUX_",
)
"""The rules of `env`, which `secret_env` shares."""

SCALING_RULES = ("adascale", "linear", "sqrt", "none")
"""Learning-rate scaling rules, by their job-file names (the enum ``SCALING_RULE_<NAME>``)."""

FIELDS: tuple[Field, ...] = (
    Field(
        "name",
        Kind.TEXT,
        "job name: 1-63 of [a-z0-9-], starting with a letter",
        "spec.name",
        required=True,
        pattern=NAME,
        pattern_says="must be 1-63 characters of [a-z0-9-] starting with a letter",
        also=_not_an_id,
    ),
    Field(
        "command",
        Kind.ARGV,
        "the replica's argv, run without a shell",
        "spec.command",
        required=True,
        max_chars=32 * 1024,
        lines=True,
    ),
    Field(
        "initial_batch_size",
        Kind.COUNT,
        "initial total batch size M0 (LR tuned for it)",
        "spec.batch.initial_batch_size",
        required=True,
        least=1,
        most=MAX_BATCH,
        range_note=" (the total batch your learning rate is tuned for)",
    ),
    _ENV,
    Field(
        "working_dir",
        Kind.TEXT,
        "working directory of every replica",
        "spec.working_dir",
        default="the launcher's default",
        max_chars=MAX_PATH,
    ),
    Field(
        "max_batch_size",
        Kind.COUNT,
        "largest total batch (default: M0)",
        "spec.batch.max_batch_size",
        default="initial_batch_size (a fixed batch)",
        most=MAX_BATCH,
        range_note=" (0: initial_batch_size)",
    ),
    Field(
        "min_local_batch_size",
        Kind.COUNT,
        "smallest per-GPU batch",
        "spec.batch.min_local_batch_size",
        default="1",
        most=MAX_BATCH,
        range_note=" (0: 1)",
    ),
    Field(
        "max_local_batch_size",
        Kind.COUNT,
        "largest per-GPU batch (memory)",
        "spec.batch.max_local_batch_size",
        default="max_batch_size",
        most=MAX_BATCH,
        range_note=" (0: max_batch_size)",
    ),
    Field(
        "scaling_rule",
        Kind.CHOICE,
        "LR scaling rule",
        "spec.scaling_rule",
        default="adascale",
        choices=SCALING_RULES,
    ),
    Field(
        "max_replicas",
        Kind.COUNT,
        "most GPUs the job may use (default: no limit)",
        "spec.max_replicas",
        default="no limit beyond the cluster",
        most=4096,
        range_note=" (0: no limit)",
    ),
    Field(
        "max_failures",
        Kind.COUNT,
        "failed replica exits tolerated (default 3)",
        "spec.max_failures",
        default="3",
        most=1000,
        range_note=" (0: 3)",
    ),
    Field(
        "stop_grace_s",
        Kind.COUNT,
        "seconds from SIGTERM to SIGKILL (default 30)",
        "spec.stop_grace_s",
        default="30 (the launcher's default)",
        most=3600,
        range_note=" seconds (0: 30)",
    ),
    Field(
        "labels",
        Kind.NAMES,
        "free-form labels, shown and usable as list filters",
        "spec.labels",
        default="none",
        max_chars=256,
        max_entries=64,
        pattern=LABEL_KEY,
        pattern_says="label keys must be 1-63 characters of [A-Za-z0-9._/-]",
    ),
    dataclasses.replace(
        _ENV,
        key="secret_env",
        summary="environment whose values the API never shows",
        api_path="spec.secret_env",
    ),
    Field(
        "image",
        Kind.TEXT,
        "OCI image the replicas run in (the launcher needs a runtime)",
        "spec.image",
        default="no container: a plain process",
        max_chars=512,
        pattern=IMAGE,
        pattern_says="is not an image reference [registry[:port]/]name[:tag]"
        "[@sha256:<64 hex digits>] (name in lowercase, e.g. ghcr.io/org/train:1.2)",
    ),
    Field(
        "shm_size_mb",
        Kind.COUNT,
        "container /dev/shm size in MiB (default: runtime's)",
        "spec.shm_size_mb",
        default="the runtime's default (64)",
        most=1 << 20,
        range_note=" MiB (0: the runtime's default)",
    ),
    Field(
        "mounts",
        Kind.MOUNTS,
        "host directories mounted into the container",
        "spec.mounts",
        default="none",
        max_entries=32,
    ),
)
"""Every job-file key, in the order of the client's `JobSpec`."""

BY_KEY: Mapping[str, Field] = {f.key: f for f in FIELDS}
KEYS: tuple[str, ...] = tuple(BY_KEY)
REQUIRED: tuple[str, ...] = tuple(f.key for f in FIELDS if f.required)
BATCH_KEYS: tuple[str, ...] = tuple(f.key for f in FIELDS if f.api_parts[0] == "batch")
"""The keys of the API's BatchLimits message (written at the top level of a job file)."""


class MountLike(Protocol):
    """What `check` reads of a mount: `Mount`, or the API's ``Mount`` message."""

    @property
    def host_path(self) -> str: ...  # noqa: D102

    @property
    def container_path(self) -> str: ...  # noqa: D102

    @property
    def read_only(self) -> bool: ...  # noqa: D102


@dataclass(frozen=True)
class Mount:
    """A host directory bind-mounted into a job's container (only with an image).

    The launcher runs the job only when `host_path` lies under one of its
    ``container_mounts_allowed`` prefixes; `check` makes sure both paths are well formed.
    """

    host_path: str
    """Absolute path on the node."""
    container_path: str
    """Absolute path inside the container."""
    read_only: bool = False
    """Mount read-only."""

    @classmethod
    def parse(cls, text: str) -> Mount:
        """Parse ``SRC:DST`` or ``SRC:DST:ro`` (``:rw`` is accepted and is the default).

        Raises:
            ValueError: `text` is not of that form, saying what is wrong.
        """
        parts = text.split(":")
        mode = parts.pop() if len(parts) == 3 else "rw"
        if len(parts) != 2 or not all(parts) or mode not in ("ro", "rw"):
            raise ValueError(
                f"{quoted(text)} is not SRC:DST[:ro] (two absolute paths, no ':' inside either)"
            )
        return cls(parts[0], parts[1], read_only=mode == "ro")

    def __str__(self) -> str:
        return f"{self.host_path}:{self.container_path}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class Violation:
    """A problem with one key of a spec, or with one entry of it."""

    key: str
    """The job-file key ("" for the spec as a whole)."""
    problem: str
    """What is wrong and what to do about it; the same words on the client and the server."""
    entry: str | None = None
    """The name of a mapping's entry (env, labels, secret_env)."""
    index: int | None = None
    """The position of a list's entry (command, mounts)."""
    part: str = ""
    """The field of that entry (a mount's ``host_path``)."""

    def _suffix(self, *, api: bool) -> str:
        if self.entry is not None:
            name = self.entry if _PLAIN_ENTRY.fullmatch(self.entry) else quoted(self.entry, 40)
            return f"[{name}]" if api else f".{name}"
        index = "" if self.index is None else f"[{self.index}]"
        return index + (f".{self.part}" if self.part else "")

    @property
    def file_path(self) -> str:
        """Where in a job file: ``env.NAME``, ``mounts[0].host_path``, ``initial_batch_size``."""
        return self.key + self._suffix(api=False)

    @property
    def api_path(self) -> str:
        """Where in the API's request: ``spec.env[NAME]``, ``spec.batch.initial_batch_size``."""
        base = BY_KEY[self.key].api_path if self.key in BY_KEY else "spec"
        return base + self._suffix(api=True)


_MAP_ENTRY = re.compile(r"\[(.*)\]$")


def file_path_of(api_path: str) -> str:
    """The job-file path of an API field path (the inverse of `Violation.api_path`).

    ``spec.batch.initial_batch_size`` → ``initial_batch_size``, ``spec.env[A]`` → ``env.A``,
    ``spec.mounts[0].host_path`` → ``mounts[0].host_path``; a path outside the spec
    (``request_id``), or the spec itself, is returned as it is.
    """
    for spec_field in sorted(FIELDS, key=lambda f: -len(f.api_path)):
        base = spec_field.api_path
        if api_path != base and not api_path.startswith((f"{base}.", f"{base}[")):
            continue
        rest = api_path[len(base) :]
        if spec_field.kind is Kind.NAMES:
            rest = _MAP_ENTRY.sub(r".\1", rest)
        return spec_field.key + rest
    return api_path


def spec_size_problem(size: int) -> str | None:
    """What to say of a spec of `size` serialized bytes; None within `MAX_SPEC_BYTES`."""
    if size <= MAX_SPEC_BYTES:
        return None
    return f"{size} bytes serialized; at most {MAX_SPEC_BYTES} (trim env, labels)"


# ---- the checks ------------------------------------------------------------------------------


def check(values: Mapping[str, Any]) -> list[Violation]:
    """Every problem of the spec `values` (job-file key → value), in table order.

    A key absent from `values` is neither checked nor read by a rule across keys; what
    follows from a value out of its own bounds (a bad initial_batch_size) is not said again.
    """
    found: list[Violation] = []
    for spec_field in FIELDS:
        if spec_field.key not in values:
            continue
        value = values[spec_field.key]
        found.extend(_CHECKS[spec_field.kind](spec_field, value))
        if spec_field.also is not None and (problem := spec_field.also(value)):
            found.append(Violation(spec_field.key, problem))
    found.extend(_batch_limits(values, out_of_bounds={v.key for v in found}))
    found.extend(_environment(values))
    found.extend(_container_only(values))
    return found


def _characters(spec_field: Field, value: str) -> str | None:
    """Refuse NUL anywhere and other control characters (outside free text: tab, newline)."""
    if "\x00" in value:
        return "contains a NUL byte, which no process can receive"
    if (_CONTROL_BUT_LINES if spec_field.lines else _CONTROL).search(value):
        return "contains a control character" + (
            " (tab and newline are allowed)" if spec_field.lines else ""
        )
    return None


def _text(spec_field: Field, value: str) -> Iterable[Violation]:
    key = spec_field.key
    if spec_field.max_chars and len(value) > spec_field.max_chars:
        yield Violation(key, f"longer than {spec_field.max_chars} characters")
    elif spec_field.pattern is not None:
        if (value or spec_field.required) and not spec_field.pattern.fullmatch(value):
            yield Violation(key, f"{quoted(value)} {spec_field.pattern_says}")
    elif problem := _characters(spec_field, value):
        yield Violation(key, problem)


def _argv(spec_field: Field, value: Sequence[str]) -> Iterable[Violation]:
    key = spec_field.key
    if not value:
        yield Violation(key, "must name at least the program to run")
        return
    if sum(len(a) for a in value) > spec_field.max_chars:
        yield Violation(key, f"longer than {spec_field.max_chars} characters in all")
    if not value[0]:
        yield Violation(key, "the program must not be empty", index=0)
    for i, argument in enumerate(value):
        # The program is a path: no line breaks there; its arguments are free text.
        rules = spec_field if i else _PROGRAM
        if problem := _characters(rules, argument):
            yield Violation(key, problem, index=i)


_PROGRAM = Field("command", Kind.TEXT, "", "spec.command")
"""The rules of a command's program (argv[0]): no control characters at all."""


def _count(spec_field: Field, value: int) -> Iterable[Violation]:
    if not spec_field.least <= value <= spec_field.most:
        yield Violation(
            spec_field.key,
            f"must be {spec_field.least} to {spec_field.most}{spec_field.range_note}, not {value}",
        )


def _choice(spec_field: Field, value: str) -> Iterable[Violation]:
    if value and value not in spec_field.choices:
        yield Violation(
            spec_field.key, f"{quoted(value)} is not one of {', '.join(spec_field.choices)}"
        )


def _names(spec_field: Field, value: Mapping[str, str]) -> Iterable[Violation]:
    key = spec_field.key
    if spec_field.max_entries and len(value) > spec_field.max_entries:
        yield Violation(key, f"{len(value)} entries; at most {spec_field.max_entries}")
    for name, item in sorted(value.items()):  # an API map has no order
        if spec_field.pattern is not None and not spec_field.pattern.fullmatch(name):
            yield Violation(key, spec_field.pattern_says, entry=name)
        elif spec_field.reserved_prefix and name.startswith(spec_field.reserved_prefix):
            reserved = spec_field.reserved_prefix
            yield Violation(
                key, f"{reserved}* variables are set by the launcher; rename it", entry=name
            )
        if spec_field.max_chars and len(item) > spec_field.max_chars:
            yield Violation(
                key, f"the value is longer than {spec_field.max_chars} characters", entry=name
            )
        elif problem := _characters(spec_field, item):
            yield Violation(key, f"the value {problem}", entry=name)


def _mounts(spec_field: Field, value: Sequence[MountLike]) -> Iterable[Violation]:
    key = spec_field.key
    if len(value) > spec_field.max_entries:
        yield Violation(key, f"{len(value)} mounts; at most {spec_field.max_entries}")
    targets: set[str] = set()
    for i, mount in enumerate(value[: spec_field.max_entries]):
        for part in ("host_path", "container_path"):
            if problem := _mount_path(getattr(mount, part)):
                yield Violation(key, problem, index=i, part=part)
        target = mount.container_path
        if target and not target.strip("/"):
            yield Violation(
                key,
                "cannot mount over the container's root: name a directory in it",
                index=i,
                part="container_path",
            )
        if target in targets:
            yield Violation(key, "mounted twice: keep one entry", index=i, part="container_path")
        targets.add(target)


def _mount_path(path: str) -> str | None:
    if len(path) > MAX_PATH:
        return f"longer than {MAX_PATH} characters"
    if problem := _characters(_PROGRAM, path):
        return problem
    if MOUNT_PATH.fullmatch(path) is None:
        return f"{quoted(path)} must be an absolute path without ':' or ','"
    if "/../" in f"{path}/" or "/./" in f"{path}/":
        return f"{quoted(path)} has '.' or '..' components: give the plain path"
    return None


_CHECKS: Mapping[Kind, Callable[[Field, Any], Iterable[Violation]]] = {
    Kind.TEXT: _text,
    Kind.ARGV: _argv,
    Kind.COUNT: _count,
    Kind.CHOICE: _choice,
    Kind.NAMES: _names,
    Kind.MOUNTS: _mounts,
}


# ---- rules across keys -----------------------------------------------------------------------


def _batch_limits(values: Mapping[str, Any], out_of_bounds: set[str]) -> Iterable[Violation]:
    """Total and per-GPU limits in order: M0 <= max_batch_size; min_local <= both maxima."""
    if any(key not in values or key in out_of_bounds for key in BATCH_KEYS):
        return
    m0 = values["initial_batch_size"]
    top = values["max_batch_size"] or m0
    if values["max_batch_size"] and top < m0:
        yield Violation(
            "max_batch_size", f"{top} is below initial_batch_size {m0}: raise it or leave it 0"
        )
    low = values["min_local_batch_size"] or 1
    high = values["max_local_batch_size"] or top
    if low > high:
        yield Violation("min_local_batch_size", f"{low} exceeds max_local_batch_size {high}")
    if low > top:
        yield Violation("min_local_batch_size", f"{low} exceeds the largest total batch {top}")


def _environment(values: Mapping[str, Any]) -> Iterable[Violation]:
    """At most `MAX_ENV` variables in all, and none both plain and secret."""
    if "env" not in values or "secret_env" not in values:
        return
    env, secret = values["env"], values["secret_env"]
    if len(env) + len(secret) > MAX_ENV:
        yield Violation(
            "env", f"{len(env) + len(secret)} variables with secret_env; at most {MAX_ENV}"
        )
    for name in sorted(set(env) & set(secret)):
        yield Violation("secret_env", "also in env; keep it in one of them", entry=name)


def _container_only(values: Mapping[str, Any]) -> Iterable[Violation]:
    """shm_size_mb and mounts need an image."""
    if values.get("image", "?"):
        return
    for key in ("shm_size_mb", "mounts"):
        if values.get(key):
            yield Violation(key, "only applies to a container: set image too, or leave it unset")
