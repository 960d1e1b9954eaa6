"""The pollux.v1 contract: fresh generated code, buf lint, and no break of the last release.

The generated code is exactly what scripts/gen_protos.py makes from protos/; `buf lint` and
`buf breaking` pass (protos/buf.yaml, against protos/released/); and the pure-Python check of
scripts/proto_contract.py, which needs no buf, finds no breaking change and does find each
kind of breaking change injected into a copy of the descriptors.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "pollux" / "v1"


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
    )
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "pollux" / "v1").iterdir()}
    committed = {p.name: p.read_bytes() for p in GENERATED.iterdir() if p.is_file()}
    assert sorted(fresh) == sorted(committed), "run scripts/gen_protos.py and commit pollux/v1"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated files {stale}: run scripts/gen_protos.py"


@pytest.mark.parametrize(
    "module",
    sorted(p.stem for p in GENERATED.glob("*_pb2*.py")),
)
def test_every_generated_module_imports(module: str) -> None:
    importlib.import_module(f"pollux.v1.{module}")


def test_every_enum_has_an_unspecified_zero() -> None:
    from pollux.v1 import types_pb2

    for enum in types_pb2.DESCRIPTOR.enum_types_by_name.values():
        assert enum.values[0].number == 0
        assert enum.values[0].name.endswith("_UNSPECIFIED"), enum.name


# -- the contract: buf lint, and no breaking change against the last release -------------------


def _load_contract() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "proto_contract", ROOT / "scripts" / "proto_contract.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


contract = _load_contract()
PINNED_BUF = ROOT / ".venv" / "buf" / "node_modules" / ".bin" / "buf"
BUF = str(PINNED_BUF) if PINNED_BUF.exists() else shutil.which("buf")
needs_buf = pytest.mark.skipif(
    BUF is None,
    reason="buf is not installed (scripts/test installs npm's @bufbuild/buf into .venv/buf); "
    "test_generated_code_keeps_the_last_release checks the contract without it",
)


def _buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert BUF is not None
    return subprocess.run(
        [BUF, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_buf
def test_buf_lint_passes() -> None:
    result = _buf("lint", "protos")
    assert result.returncode == 0, f"buf lint (protos/buf.yaml):\n{result.stdout}{result.stderr}"


@needs_buf
def test_buf_finds_no_breaking_change_against_the_last_release() -> None:
    against = contract.latest_release().relative_to(ROOT)
    result = _buf("breaking", "protos", "--against", str(against))
    assert result.returncode == 0, f"buf breaking vs {against}:\n{result.stdout}{result.stderr}"


@needs_buf
def test_buf_breaking_fails_on_a_renumbered_field_and_a_removed_enum_value(
    tmp_path: Path,
) -> None:
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    types = tmp_path / "protos" / "pollux" / "v1" / "types.proto"
    text = types.read_text()
    assert "uint32 max_replicas = 7;" in text
    assert "JOB_STATE_CANCELLED = 7;" in text
    types.write_text(
        text.replace("uint32 max_replicas = 7;", "uint32 max_replicas = 70;").replace(
            "JOB_STATE_CANCELLED = 7;", ""
        )
    )
    against = contract.latest_release().relative_to(ROOT)
    result = _buf("breaking", "protos", "--against", str(ROOT / against), cwd=tmp_path)
    assert result.returncode != 0
    assert '"max_replicas"' in result.stdout, result.stdout
    assert "JOB_STATE_CANCELLED" in result.stdout, result.stdout


@needs_buf
def test_buf_lint_fails_on_an_undocumented_field(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    types = tmp_path / "protos" / "pollux" / "v1" / "types.proto"
    text = types.read_text()
    documented = "  // Mount read-only.\n  bool read_only = 3;"
    assert documented in text
    types.write_text(text.replace(documented, "  bool read_only = 3;"))
    result = _buf("lint", "protos", cwd=tmp_path)
    assert result.returncode != 0
    assert 'Field "read_only" should have a non-empty comment' in result.stdout, result.stdout


def test_generated_code_keeps_the_last_release() -> None:
    released = contract.load(contract.latest_release())
    assert contract.breaking_changes(released, contract.generated()) == []


def test_the_last_release_is_a_snapshot_of_the_api() -> None:
    released = contract.load(contract.latest_release())
    files = {f.name for f in released.file if f.package == "pollux.v1"}
    current = {f"pollux/v1/{p.name}" for p in (ROOT / "protos" / "pollux" / "v1").glob("*.proto")}
    assert "pollux/v1/types.proto" in files
    assert files <= current, "a released .proto file is gone: clients import its generated module"
    services = {s.name for f in released.file for s in f.service}
    assert {"SchedulerService", "AgentService", "LauncherService"} <= services


def _changed(edit: Callable[[dict[str, Any]], None]) -> list[str]:
    """The breaking changes `edit` makes to a copy of the generated descriptors."""
    current = contract.generated()
    edited = descriptor_pb2.FileDescriptorSet()
    edited.CopyFrom(current)
    by_name: dict[str, Any] = {}
    for file in edited.file:
        for message in file.message_type:
            by_name[message.name] = message
        for enum in file.enum_type:
            by_name[enum.name] = enum
        for service in file.service:
            by_name[service.name] = service
        by_name[f"file:{file.name}"] = file
    edit(by_name)
    return contract.breaking_changes(current, edited)


def _field(message: Any, name: str) -> Any:
    return next(f for f in message.field if f.name == name)


def _method(service: Any, name: str) -> Any:
    return next(m for m in service.method if m.name == name)


def _remove(container: Any, name: str) -> None:
    del container[next(i for i, item in enumerate(container) if item.name == name)]


def _into_oneof(d: dict[str, Any]) -> None:
    d["JobSpec"].oneof_decl.add(name="where")
    _field(d["JobSpec"], "image").oneof_index = len(d["JobSpec"].oneof_decl) - 1


FDP = descriptor_pb2.FieldDescriptorProto
BREAKING: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "field removed": (
        lambda d: _remove(d["JobSpec"].field, "image"),
        "field pollux.v1.JobSpec.image (12) removed without reserving",
    ),
    "field renumbered": (
        lambda d: setattr(_field(d["JobSpec"], "max_replicas"), "number", 40),
        "field pollux.v1.JobSpec.max_replicas (7) renumbered to 40",
    ),
    "field type changed": (
        lambda d: setattr(_field(d["JobSpec"], "max_replicas"), "type", FDP.TYPE_UINT64),
        "field pollux.v1.JobSpec.max_replicas (7) type changed from uint32 to uint64",
    ),
    "message type of a field changed": (
        lambda d: setattr(_field(d["Job"], "allocation"), "type_name", ".pollux.v1.Node"),
        "field pollux.v1.Job.allocation (10) type changed from message pollux.v1.Allocation "
        "to message pollux.v1.Node",
    ),
    "field renamed": (
        lambda d: setattr(_field(d["JobSpec"], "name"), "name", "title"),
        "field pollux.v1.JobSpec.name (1) renamed to title",
    ),
    "JSON name changed": (
        lambda d: setattr(_field(d["JobSpec"], "max_replicas"), "json_name", "maxGpus"),
        "field pollux.v1.JobSpec.max_replicas (7) JSON name changed from maxReplicas to maxGpus",
    ),
    "repeated made singular": (
        lambda d: setattr(_field(d["JobSpec"], "command"), "label", FDP.LABEL_OPTIONAL),
        "field pollux.v1.JobSpec.command (2) changed from repeated to singular",
    ),
    "field moved into a oneof": (
        _into_oneof,
        "field pollux.v1.JobSpec.image (12) moved from oneof '' to 'where'",
    ),
    "reservation dropped": (
        lambda d: d["ReplicaStatus"].ClearField("reserved_range"),
        "message pollux.v1.ReplicaStatus no longer reserves numbers 5-5",
    ),
    "message removed": (
        lambda d: _remove(d["file:pollux/v1/types.proto"].message_type, "Mount"),
        "message pollux.v1.Mount removed",
    ),
    "enum value removed": (
        lambda d: _remove(d["JobState"].value, "JOB_STATE_CANCELLED"),
        "enum value pollux.v1.JobState.JOB_STATE_CANCELLED (7) removed without reserving",
    ),
    "enum value renumbered": (
        lambda d: setattr(
            next(v for v in d["JobState"].value if v.name == "JOB_STATE_CANCELLED"), "number", 9
        ),
        "enum value pollux.v1.JobState.JOB_STATE_CANCELLED (7) renumbered to 9",
    ),
    "enum value renamed": (
        lambda d: setattr(
            next(v for v in d["JobState"].value if v.name == "JOB_STATE_CANCELLED"),
            "name",
            "JOB_STATE_CANCELED",
        ),
        "enum value pollux.v1.JobState.JOB_STATE_CANCELLED (7) renamed to JOB_STATE_CANCELED",
    ),
    "enum removed": (
        lambda d: _remove(d["file:pollux/v1/types.proto"].enum_type, "SyncModel"),
        "enum pollux.v1.SyncModel removed",
    ),
    "RPC removed": (
        lambda d: _remove(d["SchedulerService"].method, "Explain"),
        "rpc pollux.v1.SchedulerService.Explain removed",
    ),
    "RPC request type changed": (
        lambda d: setattr(
            _method(d["SchedulerService"], "GetJob"), "input_type", ".pollux.v1.ExplainRequest"
        ),
        "rpc pollux.v1.SchedulerService.GetJob input_type changed",
    ),
    "RPC response type changed": (
        lambda d: setattr(
            _method(d["AgentService"], "GetModel"), "output_type", ".pollux.v1.JobModel"
        ),
        "rpc pollux.v1.AgentService.GetModel output_type changed",
    ),
    "RPC made unary": (
        lambda d: setattr(_method(d["SchedulerService"], "WatchJobs"), "server_streaming", False),
        "rpc pollux.v1.SchedulerService.WatchJobs server_streaming changed from True to False",
    ),
    "service removed": (
        lambda d: _remove(d["file:pollux/v1/admin_service.proto"].service, "AdminService"),
        "service pollux.v1.AdminService removed",
    ),
}


@pytest.mark.parametrize("case", sorted(BREAKING))
def test_the_contract_check_fails_on_a_breaking_change(case: str) -> None:
    edit, expected = BREAKING[case]
    problems = _changed(edit)
    assert any(p.startswith(expected) for p in problems), problems


def _reserve(message: Any, name: str) -> None:
    field = _field(message, name)
    message.reserved_range.add(start=field.number, end=field.number + 1)
    message.reserved_name.append(name)
    _remove(message.field, name)


COMPATIBLE: dict[str, Callable[[dict[str, Any]], None]] = {
    "field added": lambda d: d["JobSpec"].field.add(
        name="priority", number=15, type=FDP.TYPE_UINT32, label=FDP.LABEL_OPTIONAL
    ),
    "enum value added": lambda d: d["JobState"].value.add(name="JOB_STATE_SUSPENDED", number=8),
    "message added": lambda d: d["file:pollux/v1/types.proto"].message_type.add(name="Quota"),
    "RPC added": lambda d: d["SchedulerService"].method.add(
        name="Ping",
        input_type=".pollux.v1.ClusterStatusRequest",
        output_type=".pollux.v1.ClusterStatusResponse",
    ),
    "field removed with its number and name reserved": lambda d: _reserve(d["JobSpec"], "image"),
    "field made optional (presence)": lambda d: setattr(
        _field(d["JobSpec"], "max_replicas"), "proto3_optional", True
    ),
}


@pytest.mark.parametrize("case", sorted(COMPATIBLE))
def test_the_contract_check_accepts_a_compatible_change(case: str) -> None:
    assert _changed(COMPATIBLE[case]) == []


def test_removing_any_field_or_enum_value_is_caught() -> None:
    current = contract.generated()
    removable = [
        (f.name, m.name, field.name)
        for f in current.file
        if f.package == "pollux.v1"
        for m in f.message_type
        for field in m.field
    ]
    assert len(removable) > 200
    for file_name, message_name, field_name in removable:
        edited = descriptor_pb2.FileDescriptorSet()
        edited.CopyFrom(current)
        file = next(f for f in edited.file if f.name == file_name)
        message = next(m for m in file.message_type if m.name == message_name)
        _remove(message.field, field_name)
        assert contract.breaking_changes(current, edited), (message_name, field_name)
    for f in current.file:
        for enum in f.enum_type:
            for value in enum.value:
                edited = descriptor_pb2.FileDescriptorSet()
                edited.CopyFrom(current)
                target = next(e for x in edited.file for e in x.enum_type if e.name == enum.name)
                _remove(target.value, value.name)
                assert contract.breaking_changes(current, edited), (enum.name, value.name)


def test_json_names_follow_protobuf() -> None:
    # The snapshot carries protoc's JSON names; the generated modules carry none unless set.
    released = contract.load(contract.latest_release())
    for file in released.file:
        for message in file.message_type:
            for field in message.field:
                bare = descriptor_pb2.FieldDescriptorProto(name=field.name)
                assert contract.json_name(bare) == field.json_name, field.name


def test_a_release_snapshot_is_written_once_and_matches_the_protos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    latest = contract.latest_release()
    monkeypatch.setattr(contract, "RELEASED", tmp_path)
    made = contract.release("v9.9.9")
    assert made == tmp_path / "v9.9.9.binpb"
    assert contract.latest_release() == made
    assert contract.breaking_changes(contract.load(latest), contract.load(made)) == []
    assert contract.breaking_changes(contract.load(made), contract.generated()) == []
    with pytest.raises(FileExistsError):
        contract.release("v9.9.9")
    with pytest.raises(ValueError, match="not a version"):
        contract.release("9.9")


def test_the_check_command_exits_non_zero_on_a_breaking_change(tmp_path: Path) -> None:
    script = [sys.executable, str(ROOT / "scripts" / "proto_contract.py"), "check"]
    ok = subprocess.run(script, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "0 breaking change(s) against v" in ok.stdout
    # A snapshot with a field the protos no longer have: the protos "removed" it.
    released = contract.load(contract.latest_release())
    spec = next(m for f in released.file for m in f.message_type if m.name == "JobSpec")
    spec.field.add(name="gone", number=99, type=FDP.TYPE_STRING, label=FDP.LABEL_OPTIONAL)
    against = tmp_path / "v0.0.1.binpb"
    against.write_bytes(released.SerializeToString())
    broken = subprocess.run(
        [*script, "--against", str(against)], capture_output=True, text=True, check=False
    )
    assert broken.returncode == 1
    assert "field pollux.v1.JobSpec.gone (99) removed" in broken.stderr
