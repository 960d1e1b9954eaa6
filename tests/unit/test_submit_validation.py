"""SubmitJob validation: bounded input, whole-string matches, known enums, every problem at once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.scheduler.validation import MAX_SPEC_BYTES, validate_submit
from pollux.service.errors import InvalidArgument, status_of
from pollux.v1 import types_pb2 as pb


def good_spec(**changes: object) -> pb.JobSpec:
    spec = pb.JobSpec(
        name="train",
        command=["python", "train.py", "--note", "two\nlines\tand a tab"],
        env={"TOKEN": "multi\nline value"},
        working_dir="/home/me/job",
        batch=pb.BatchLimits(initial_batch_size=64),
        labels={"team": "vision"},
    )
    for field, value in changes.items():
        if isinstance(value, dict):
            getattr(spec, field).update(value)
        elif isinstance(value, list):
            del getattr(spec, field)[:]
            getattr(spec, field).extend(value)
        else:
            setattr(spec, field, value)
    return spec


def _mount(host: str, target: str, *, read_only: bool = False) -> pb.Mount:
    return pb.Mount(host_path=host, container_path=target, read_only=read_only)


def problems(spec: pb.JobSpec, request_id: str = "r-1") -> dict[str, str]:
    try:
        validate_submit(spec, request_id, True)
    except InvalidArgument as error:
        return dict(error.violations)
    return {}


def test_a_good_spec_with_newlines_and_tabs_in_free_text_passes() -> None:
    assert problems(good_spec()) == {}


BAD = {
    "a name ending in a newline": (good_spec(name="train\n"), "spec.name"),
    "a request id ending in a newline": (good_spec(), "request_id"),
    "a NUL byte in an argument": (good_spec(command=["python", "a\x00b"]), "spec.command[1]"),
    "a NUL byte in the program": (good_spec(command=["py\x00thon"]), "spec.command[0]"),
    "a control character in the program": (good_spec(command=["py\nthon"]), "spec.command[0]"),
    "a NUL byte in an env value": (good_spec(env={"A": "x\x00"}), "spec.env[A]"),
    "a NUL byte in the working dir": (good_spec(working_dir="/tmp/a\x00b"), "spec.working_dir"),
    "a newline in the working dir": (good_spec(working_dir="/tmp/a\nb"), "spec.working_dir"),
    "an escape in a label value": (good_spec(labels={"k": "\x1b[31m"}), "spec.labels[k]"),
    "an unknown scaling rule": (good_spec(scaling_rule=99), "spec.scaling_rule"),
    "a label key with a space": (good_spec(labels={"my key": "v"}), "spec.labels['my key']"),
    "an env name ending in a newline": (good_spec(env={"A\n": "v"}), "spec.env['A\\n']"),
    "an image with uppercase": (good_spec(image="Ubuntu:22.04"), "spec.image"),
    "an image with a space": (good_spec(image="ubuntu 22.04"), "spec.image"),
    "an image ending in a newline": (good_spec(image="ubuntu\n"), "spec.image"),
    "an image with an empty tag": (good_spec(image="ubuntu:"), "spec.image"),
    "an image with a short digest": (good_spec(image="ubuntu@sha256:abc"), "spec.image"),
    "an image with a bad port": (good_spec(image="reg:port/ubuntu"), "spec.image"),
    "an overlong image": (good_spec(image="a" * 513), "spec.image"),
    "shm without an image": (good_spec(shm_size_mb=64), "spec.shm_size_mb"),
    "mounts without an image": (good_spec(mounts=[_mount("/a", "/b")]), "spec.mounts"),
    "too much shm": (good_spec(image="u", shm_size_mb=2**20 + 1), "spec.shm_size_mb"),
    "a relative mount source": (
        good_spec(image="u", mounts=[_mount("data", "/data")]),
        "spec.mounts[0].host_path",
    ),
    "a relative mount target": (
        good_spec(image="u", mounts=[_mount("/data", "data")]),
        "spec.mounts[0].container_path",
    ),
    "a colon in a mount source": (
        good_spec(image="u", mounts=[_mount("/a:b", "/data")]),
        "spec.mounts[0].host_path",
    ),
    "a comma in a mount target": (
        good_spec(image="u", mounts=[_mount("/a", "/d,ata")]),
        "spec.mounts[0].container_path",
    ),
    "a NUL in a mount source": (
        good_spec(image="u", mounts=[_mount("/a\x00", "/data")]),
        "spec.mounts[0].host_path",
    ),
    "a newline in a mount target": (
        good_spec(image="u", mounts=[_mount("/a", "/da\nta")]),
        "spec.mounts[0].container_path",
    ),
    "a .. in a mount source": (
        good_spec(image="u", mounts=[_mount("/srv/../etc", "/data")]),
        "spec.mounts[0].host_path",
    ),
    "a mount over the container root": (
        good_spec(image="u", mounts=[_mount("/srv", "/")]),
        "spec.mounts[0].container_path",
    ),
    "a target mounted twice": (
        good_spec(image="u", mounts=[_mount("/a", "/data"), _mount("/b", "/data")]),
        "spec.mounts[1].container_path",
    ),
    "too many mounts": (
        good_spec(image="u", mounts=[_mount(f"/a{i}", f"/b{i}") for i in range(33)]),
        "spec.mounts",
    ),
}


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu",
        "ubuntu:22.04",
        "library/ubuntu:22.04",
        "ghcr.io/org/team/train:1.2.3-cuda12",
        "localhost/pollux-base:bookworm",
        "registry.example.com:5000/ml/train_v2",
        "127.0.0.1:5000/train",
        "train@sha256:" + "a" * 64,
        "ghcr.io/org/train:1.2@sha256:" + "0123456789abcdef" * 4,
    ],
)
def test_image_references_are_accepted(image: str) -> None:
    mounts = [_mount("/srv/data", "/data", read_only=True), _mount("/scratch", "/scratch")]
    assert problems(good_spec(image=image, shm_size_mb=2048, mounts=mounts)) == {}


@pytest.mark.parametrize("case", sorted(BAD), ids=str)
def test_bad_input_is_refused_naming_the_field(case: str) -> None:
    spec, field = BAD[case]
    request_id = "r-1\n" if case == "a request id ending in a newline" else "r-1"
    assert field in problems(spec, request_id)


def test_an_oversized_spec_is_refused_naming_the_limit() -> None:
    labels = {f"k{i}": "v" * 250 for i in range(60)}  # each within its bounds
    env = {f"V{i}": "x" * 4096 for i in range(100)}
    got = problems(good_spec(labels=labels, env=env))
    assert str(MAX_SPEC_BYTES) in got["spec"]


def test_every_problem_is_reported_at_once() -> None:
    spec = good_spec(name="Bad Name", working_dir="a\x00", scaling_rule=42, labels={"": "x"})
    assert {"spec.name", "spec.working_dir", "spec.scaling_rule", "spec.labels['']"} <= set(
        problems(spec)
    )


text = st.text(alphabet=st.characters(codec="utf-8"), max_size=300)


@settings(max_examples=200, deadline=None)
@given(
    name=text,
    request_id=text,
    program=text,
    argument=text,
    env_name=text,
    env_value=text,
    working_dir=text,
    label=text,
)
def test_any_input_is_accepted_clean_or_refused_with_a_bounded_message(
    name: str,
    request_id: str,
    program: str,
    argument: str,
    env_name: str,
    env_value: str,
    working_dir: str,
    label: str,
) -> None:
    spec = pb.JobSpec(
        name=name,
        command=[program, argument],
        env={env_name: env_value},
        working_dir=working_dir,
        batch=pb.BatchLimits(initial_batch_size=64),
        labels={label: label},
    )
    try:
        validate_submit(spec, request_id, True)
    except InvalidArgument as error:
        _, message, details = status_of(error)
        assert len(message) <= 1024
        assert len(details[0].field_violations) <= 12
        return
    accepted = [name, request_id, program, env_name, working_dir, label]
    assert not any(c in s for s in accepted for c in ("\x00", "\n", "\r", "\x1b"))
    assert "\x00" not in argument + env_value
