"""One job-spec contract (`pollux.jobspec`): the client and the scheduler refuse the same specs
with the same words, and the table covers the API's JobSpec and the client's exactly.

The client's entry point is `JobSpec.from_mapping` (a job file's mapping, the CLI's flags);
the scheduler's is `validate_submit` on the API message, built here by hand from the same
values. Both call `pollux.jobspec.check`; these tests hold them to it on every value hypothesis
draws, the bounds of each field included.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux import jobspec
from pollux.client import cli
from pollux.client._convert import spec_from_proto, spec_to_proto
from pollux.client.errors import JobSpecError
from pollux.client.types import SPEC_KEYS, JobSpec, ScalingRule
from pollux.jobspec import Kind, Mount, Violation, wire
from pollux.scheduler.validation import validate_submit
from pollux.service.errors import InvalidArgument
from pollux.v1 import types_pb2 as pb

# ---- the table is the API's JobSpec and the client's JobSpec, key for key ---------------------


def api_fields(message: Any, prefix: str = "spec") -> set[str]:
    """Every leaf field path of the JobSpec message (BatchLimits is a group of leaves)."""
    paths = set()
    for field in message.DESCRIPTOR.fields:
        path = f"{prefix}.{field.name}"
        nested = field.message_type
        if nested is not None and nested.name == "BatchLimits":
            paths |= api_fields(getattr(message, field.name), path)
        else:
            paths.add(path)
    return paths


def test_every_field_of_the_api_spec_has_one_key() -> None:
    assert sorted(f.api_path for f in jobspec.FIELDS) == sorted(api_fields(pb.JobSpec()))


def test_the_client_spec_has_exactly_the_contract_keys_and_defaults() -> None:
    fields = dataclasses.fields(JobSpec)
    assert tuple(f.name for f in fields) == jobspec.KEYS == SPEC_KEYS
    missing = dataclasses.MISSING
    required = tuple(
        f.name for f in fields if f.default is missing and f.default_factory is missing
    )
    assert required == jobspec.REQUIRED
    assert get_args(ScalingRule) == jobspec.SCALING_RULES
    # Leaving a key out of a job file sends the API's zero value, which means its default.
    spec = JobSpec("job", ("x",), 8)
    assert spec_to_proto(spec) == wire.to_message(
        {"name": "job", "command": ("x",), "initial_batch_size": 8, "scaling_rule": "adascale"}
    )


def test_every_count_fits_the_wire() -> None:
    for spec_field in jobspec.FIELDS:
        if spec_field.kind is Kind.COUNT:
            assert 0 <= spec_field.least <= spec_field.most < 2**32, spec_field.key


# ---- the same values, both entry points ------------------------------------------------------

CHARS = st.characters(codec="utf-8", categories=("Ll", "Lu", "Nd", "Pd", "Cc"))
SMALL_TEXT = st.text(CHARS, max_size=8)


def counts(spec_field: jobspec.Field) -> st.SearchStrategy[int]:
    """Values at and around the bounds of a count, and some within."""
    edges = {0, 1, spec_field.least, spec_field.most, spec_field.most + 1}
    return st.sampled_from(sorted(edges)) | st.integers(0, min(spec_field.most + 2, 2**32 - 1))


NAMES = st.sampled_from(["job", "train-1", "Bad_Name", "abc", "j-12", "run\n", "", "x" * 64])
ENV_NAMES = st.sampled_from(["A", "DEBUG", "POLLUX_RANK", "1X", "A\n", "a b"])
LABEL_KEYS = st.sampled_from(["team", "a/b.c", "a b", "", "k" * 64])
IMAGES = st.sampled_from(["", "ubuntu", "ghcr.io/org/train:1.2", "Ubuntu", "u:", "a" * 513])
PATHS = st.sampled_from(["/data", "/srv/x", "rel", "/", "/a/../b", "/a,b", "/a\nb", "/d"])
MOUNTS = st.lists(st.builds(Mount, PATHS, PATHS, st.booleans()), max_size=3)

VALUES = st.fixed_dictionaries(
    {
        "name": NAMES | SMALL_TEXT,
        "command": st.lists(SMALL_TEXT, max_size=3),
        "initial_batch_size": counts(jobspec.BY_KEY["initial_batch_size"]),
    },
    optional={
        "env": st.dictionaries(ENV_NAMES, SMALL_TEXT, max_size=3),
        "secret_env": st.dictionaries(ENV_NAMES, SMALL_TEXT, max_size=2),
        "labels": st.dictionaries(LABEL_KEYS, st.text(CHARS, max_size=300), max_size=3),
        "working_dir": st.sampled_from(["", "/w", "rel/dir", "/a\x00b"]) | SMALL_TEXT,
        "scaling_rule": st.sampled_from(("", *jobspec.SCALING_RULES)),
        "image": IMAGES,
        "mounts": MOUNTS,
        **{
            f.key: counts(f)
            for f in jobspec.FIELDS
            if f.kind is Kind.COUNT and f.key != "initial_batch_size"
        },
    },
)
"""A job file's mapping, well typed (type mistakes are the client's own: test_client_jobfile)."""


def api_message(values: dict[str, Any]) -> pb.JobSpec:
    """The message a raw API caller would send with `values`, written without the contract."""
    spec = pb.JobSpec(
        name=values["name"],
        command=values["command"],
        env=values.get("env", {}),
        working_dir=values.get("working_dir", ""),
        batch=pb.BatchLimits(
            initial_batch_size=values["initial_batch_size"],
            max_batch_size=values.get("max_batch_size", 0),
            min_local_batch_size=values.get("min_local_batch_size", 0),
            max_local_batch_size=values.get("max_local_batch_size", 0),
        ),
        max_replicas=values.get("max_replicas", 0),
        max_failures=values.get("max_failures", 0),
        stop_grace_s=values.get("stop_grace_s", 0),
        labels=values.get("labels", {}),
        secret_env=values.get("secret_env", {}),
        image=values.get("image", ""),
        shm_size_mb=values.get("shm_size_mb", 0),
        mounts=[
            pb.Mount(host_path=m.host_path, container_path=m.container_path, read_only=m.read_only)
            for m in values.get("mounts", [])
        ],
    )
    rule = values.get("scaling_rule", "")
    spec.scaling_rule = pb.ScalingRule.Value(f"SCALING_RULE_{rule.upper()}") if rule else 0
    return spec


def server_problems(message: pb.JobSpec) -> list[tuple[str, str]]:
    """What SubmitJob refuses in `message`, fields named by their job-file key."""
    try:
        validate_submit(message, "req-1", has_spec=True)
    except InvalidArgument as error:
        return [(cli.file_key_path(f), p) for f, p in error.violations]
    return []


def client_problems(values: dict[str, Any]) -> list[tuple[str, str]]:
    """What the client refuses in the job file `values`."""
    try:
        JobSpec.from_mapping(values)
    except JobSpecError as error:
        return [(f, p) for f, p in error.violations]
    return []


@settings(max_examples=400, deadline=None)
@given(values=VALUES)
def test_the_client_and_the_server_refuse_the_same_fields_in_the_same_words(
    values: dict[str, Any],
) -> None:
    assert client_problems(values) == server_problems(api_message(values))


@settings(max_examples=200, deadline=None)
@given(values=VALUES)
def test_a_spec_the_client_accepts_travels_and_the_server_accepts(values: dict[str, Any]) -> None:
    try:
        spec = JobSpec.from_mapping(values)
    except JobSpecError:
        return
    message = spec_to_proto(spec)
    assert server_problems(message) == []
    assert spec_from_proto(message) == spec


@settings(max_examples=200, deadline=None)
@given(values=VALUES)
def test_the_wire_carries_every_key_both_ways(values: dict[str, Any]) -> None:
    message = api_message(values)
    assert wire.to_message(wire.values_of(message)) == message
    assert wire.values_of(wire.to_message(wire.values_of(message))) == wire.values_of(message)


def test_an_unknown_enum_number_is_refused_by_name() -> None:
    message = api_message({"name": "job", "command": ["x"], "initial_batch_size": 8})
    message.scaling_rule = 99  # type: ignore[assignment]
    assert server_problems(message) == [
        ("scaling_rule", "'99' is not one of adascale, linear, sqrt, none")
    ]
    # A newer server's rule reads as the default on this client.
    assert spec_from_proto(message).scaling_rule == "adascale"


def test_an_oversized_spec_is_refused_by_both_in_the_same_words() -> None:
    values = {
        "name": "big",
        "command": ["x"],
        "initial_batch_size": 8,
        "env": {f"V{i}": "x" * 4000 for i in range(20)},
        "scaling_rule": "adascale",  # as the client sends it: the size counts every byte
    }
    client = client_problems(values)
    assert client == server_problems(api_message(values))
    assert client[0][0] == "spec"
    assert "bytes serialized; at most 65536" in client[0][1]


@pytest.mark.parametrize(
    ("violation", "file_path", "api_path"),
    [
        (Violation("name", ""), "name", "spec.name"),
        (Violation("max_batch_size", ""), "max_batch_size", "spec.batch.max_batch_size"),
        (Violation("env", "", entry="A_1"), "env.A_1", "spec.env[A_1]"),
        (Violation("labels", "", entry="a b"), "labels.'a b'", "spec.labels['a b']"),
        (Violation("command", "", index=2), "command[2]", "spec.command[2]"),
        (
            Violation("mounts", "", index=0, part="host_path"),
            "mounts[0].host_path",
            "spec.mounts[0].host_path",
        ),
        (Violation("", ""), "", "spec"),
    ],
)
def test_a_violation_is_named_in_the_file_and_in_the_api(
    violation: Violation, file_path: str, api_path: str
) -> None:
    assert violation.file_path == file_path
    assert violation.api_path == api_path
    assert jobspec.file_path_of(api_path) == (file_path or "spec")


@pytest.mark.usefixtures("no_user_config")
def test_a_bad_job_file_is_refused_by_the_cli_with_the_servers_words(
    tmp_path: Path, capsys, never_submit
) -> None:
    values = {
        "name": "cafe",
        "command": ["python", "t.py"],
        "initial_batch_size": 64,
        "stop_grace_s": 7200,
        "labels": {"team name": "vision"},
        "image": "Ubuntu:22.04",
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(values))
    assert cli.main(["submit", "-f", str(path)], connect=never_submit) == 1
    printed = capsys.readouterr().err.splitlines()[1:]
    assert printed == [f"  {f}: {p}" for f, p in server_problems(api_message(values))]
    assert [line.split(": ", 1)[0].strip() for line in printed] == [
        "name",
        "stop_grace_s",
        "labels.'team name'",
        "image",
    ]
