"""Keep the pollux.v1 wire and JSON contract: compare the protos with the last release's.

`protos/released/vX.Y.Z.binpb` is the contract a release shipped: a FileDescriptorSet (which
is also a Buf image) of `protos/`, made by `release`. `check` compares the descriptors of the
generated `pollux.v1` modules with the newest snapshot and lists every change that would break
a client built against it, on the wire or in JSON. It needs no buf, so the guarantee holds
where buf cannot be installed; `buf breaking` (protos/buf.yaml, WIRE_JSON) checks the same
contract from the .proto files. See docs/architecture.md, "The proto contract".

    python scripts/proto_contract.py check [--against FILE]
    python scripts/proto_contract.py release VERSION   # at a release, e.g. v0.2.0
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
RELEASED = PROTO_ROOT / "released"
PACKAGE = "pollux.v1"
VERSION = re.compile(r"v(\d+)\.(\d+)\.(\d+)")

FDP = descriptor_pb2.FieldDescriptorProto
Messages = dict[str, descriptor_pb2.DescriptorProto]
Enums = dict[str, descriptor_pb2.EnumDescriptorProto]


def releases() -> list[Path]:
    """The snapshots under protos/released/, oldest version first."""
    found = []
    for path in RELEASED.glob("v*.binpb"):
        match = VERSION.fullmatch(path.stem)
        if match is not None:
            found.append((tuple(int(g) for g in match.groups()), path))
    return [path for _, path in sorted(found)]


def latest_release() -> Path:
    """The newest snapshot: the contract the next release must keep."""
    found = releases()
    if not found:
        raise FileNotFoundError(f"no vX.Y.Z.binpb under {RELEASED}")
    return found[-1]


def load(path: Path) -> descriptor_pb2.FileDescriptorSet:
    """A snapshot (a FileDescriptorSet or Buf image: the same wire format)."""
    files = descriptor_pb2.FileDescriptorSet()
    files.ParseFromString(path.read_bytes())
    return files


def generated() -> descriptor_pb2.FileDescriptorSet:
    """The descriptors of the committed `pollux.v1` modules (what clients import)."""
    files = descriptor_pb2.FileDescriptorSet()
    for path in sorted((ROOT / "pollux" / "v1").glob("*_pb2.py")):
        module = importlib.import_module(f"pollux.v1.{path.stem}")
        module.DESCRIPTOR.CopyToProto(files.file.add())
    return files


def json_name(field: descriptor_pb2.FieldDescriptorProto) -> str:
    """The field's JSON name: its json_name option, else protobuf's lowerCamelCase of it."""
    if field.HasField("json_name"):
        return field.json_name
    out: list[str] = []
    upper = False
    for char in field.name:
        if char == "_":
            upper = True
        else:
            out.append(char.upper() if upper else char)
            upper = False
    return "".join(out)


def _messages(
    prefix: str, messages: list[descriptor_pb2.DescriptorProto]
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    for message in messages:
        name = f"{prefix}.{message.name}"
        yield name, message
        yield from _messages(name, list(message.nested_type))


def _enums(
    prefix: str,
    enums: list[descriptor_pb2.EnumDescriptorProto],
    messages: list[descriptor_pb2.DescriptorProto],
) -> Iterator[tuple[str, descriptor_pb2.EnumDescriptorProto]]:
    for enum in enums:
        yield f"{prefix}.{enum.name}", enum
    for message in messages:
        name = f"{prefix}.{message.name}"
        yield from _enums(name, list(message.enum_type), list(message.nested_type))


def _index(
    files: descriptor_pb2.FileDescriptorSet, package: str
) -> tuple[Messages, Enums, dict[str, descriptor_pb2.ServiceDescriptorProto]]:
    """Messages, enums and services of `package` by full name (files do not matter on the wire)."""
    messages: Messages = {}
    enums: Enums = {}
    services: dict[str, descriptor_pb2.ServiceDescriptorProto] = {}
    for file in files.file:
        if file.package != package:
            continue
        messages.update(_messages(package, list(file.message_type)))
        enums.update(_enums(package, list(file.enum_type), list(file.message_type)))
        services.update((f"{package}.{s.name}", s) for s in file.service)
    return messages, enums, services


def _reserved(number: int, name: str, ranges: list[tuple[int, int]], names: list[str]) -> bool:
    """Whether both `number` and `name` are reserved (`ranges` are [start, end))."""
    return any(a <= number < b for a, b in ranges) and name in names


def _dropped_reservations(
    what: str,
    old: list[tuple[int, int]],
    new: list[tuple[int, int]],
    old_names: list[str],
    new_names: list[str],
) -> Iterator[str]:
    """A reservation of `old` that `new` no longer holds ([start, end) ranges)."""
    for a, b in old:
        if not any(c <= a and b <= d for c, d in new):
            yield f"{what} no longer reserves numbers {a}-{b - 1}"
    for name in old_names:
        if name not in new_names:
            yield f"{what} no longer reserves the name {name!r}"


def _type(field: descriptor_pb2.FieldDescriptorProto) -> str:
    kind = FDP.Type.Name(field.type).removeprefix("TYPE_").lower()
    return f"{kind} {field.type_name.lstrip('.')}" if field.type_name else kind


def _label(field: descriptor_pb2.FieldDescriptorProto) -> str:
    return "repeated" if field.label == FDP.LABEL_REPEATED else "singular"


def _oneof(
    message: descriptor_pb2.DescriptorProto, field: descriptor_pb2.FieldDescriptorProto
) -> str:
    if not field.HasField("oneof_index") or field.proto3_optional:
        return ""
    return message.oneof_decl[field.oneof_index].name


def _message_changes(
    name: str, old: descriptor_pb2.DescriptorProto, new: descriptor_pb2.DescriptorProto
) -> Iterator[str]:
    fields = {f.number: f for f in new.field}
    ranges = [(r.start, r.end) for r in new.reserved_range]
    for was in old.field:
        where = f"field {name}.{was.name} ({was.number})"
        now = fields.get(was.number)
        if now is None:
            if _reserved(was.number, was.name, ranges, list(new.reserved_name)):
                continue
            moved = next((f.number for f in new.field if f.name == was.name), None)
            if moved is not None:
                yield f"{where} renumbered to {moved}"
            else:
                yield f"{where} removed without reserving its number and name"
            continue
        if now.name != was.name:
            yield f"{where} renamed to {now.name} (JSON and text formats use the name)"
        elif json_name(now) != json_name(was):
            yield f"{where} JSON name changed from {json_name(was)} to {json_name(now)}"
        if _type(now) != _type(was):
            yield f"{where} type changed from {_type(was)} to {_type(now)}"
        if _label(now) != _label(was):
            yield f"{where} changed from {_label(was)} to {_label(now)}"
        if _oneof(new, now) != _oneof(old, was):
            yield f"{where} moved from oneof {_oneof(old, was)!r} to {_oneof(new, now)!r}"
    yield from _dropped_reservations(
        f"message {name}",
        [(r.start, r.end) for r in old.reserved_range],
        ranges,
        list(old.reserved_name),
        list(new.reserved_name),
    )


def _enum_changes(
    name: str, old: descriptor_pb2.EnumDescriptorProto, new: descriptor_pb2.EnumDescriptorProto
) -> Iterator[str]:
    pairs = {(v.number, v.name) for v in new.value}
    ranges = [(r.start, r.end + 1) for r in new.reserved_range]  # enum ranges are inclusive
    for was in old.value:
        if (was.number, was.name) in pairs:
            continue
        where = f"enum value {name}.{was.name} ({was.number})"
        moved = next((v.number for v in new.value if v.name == was.name), None)
        renamed = [v.name for v in new.value if v.number == was.number]
        if moved is not None:
            yield f"{where} renumbered to {moved}"
        elif renamed:
            yield f"{where} renamed to {renamed[0]} (JSON carries enum values by name)"
        elif not _reserved(was.number, was.name, ranges, list(new.reserved_name)):
            yield f"{where} removed without reserving its number and name"
    yield from _dropped_reservations(
        f"enum {name}",
        [(r.start, r.end + 1) for r in old.reserved_range],
        ranges,
        list(old.reserved_name),
        list(new.reserved_name),
    )


def breaking_changes(
    old: descriptor_pb2.FileDescriptorSet,
    new: descriptor_pb2.FileDescriptorSet,
    package: str = PACKAGE,
) -> list[str]:
    """Every change from `old` to `new` of `package` that breaks a client built against `old`.

    Breaking: a message, enum or service removed; a field or enum value removed (unless its
    number and name are both reserved), renumbered or renamed; a field's JSON name, type,
    cardinality or oneof changed; a reservation dropped; an RPC removed or its request or
    response type or streaming changed. Additions (fields, values, messages, RPCs) never are.
    """
    old_messages, old_enums, old_services = _index(old, package)
    new_messages, new_enums, new_services = _index(new, package)
    problems: list[str] = []
    for name, message in old_messages.items():
        if name not in new_messages:
            problems.append(f"message {name} removed")
        else:
            problems.extend(_message_changes(name, message, new_messages[name]))
    for name, enum in old_enums.items():
        if name not in new_enums:
            problems.append(f"enum {name} removed")
        else:
            problems.extend(_enum_changes(name, enum, new_enums[name]))
    for name, service in old_services.items():
        if name not in new_services:
            problems.append(f"service {name} removed")
            continue
        methods = {m.name: m for m in new_services[name].method}
        for was in service.method:
            now = methods.get(was.name)
            where = f"rpc {name}.{was.name}"
            if now is None:
                problems.append(f"{where} removed")
                continue
            for part in ("input_type", "output_type", "client_streaming", "server_streaming"):
                before, after = getattr(was, part), getattr(now, part)
                if before != after:
                    problems.append(f"{where} {part} changed from {before} to {after}")
    return problems


def release(version: str) -> Path:
    """Write protos/released/<version>.binpb from protos/ (the contract of that release).

    Made with the pinned grpcio-tools' protoc, imports included: the file is a
    FileDescriptorSet, which `buf breaking --against` reads as an image.
    """
    if VERSION.fullmatch(version) is None:
        raise ValueError(f"{version!r} is not a version vX.Y.Z")
    out = RELEASED / f"{version}.binpb"
    if out.exists():
        raise FileExistsError(f"{out} exists: a released contract is never rewritten")
    include = resources.files("grpc_tools") / "_proto"
    sources = sorted(
        p.relative_to(PROTO_ROOT) for p in (PROTO_ROOT / "pollux" / "v1").glob("*.proto")
    )
    RELEASED.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        made = Path(tmp) / out.name
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--descriptor_set_out={made}",
            "--include_imports",
            *(str(p) for p in sources),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out.write_bytes(made.read_bytes())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="compare pollux.v1 with the last release")
    check.add_argument("--against", type=Path, help="a snapshot (default: the newest)")
    made = commands.add_parser("release", help="snapshot protos/ as a released contract")
    made.add_argument("version", help="the release, vX.Y.Z")
    args = parser.parse_args()
    if args.command == "release":
        previous = releases()
        out = release(args.version)
        print(f"wrote {out.relative_to(ROOT)}")
        if previous:
            problems = breaking_changes(load(previous[-1]), load(out))
            for problem in problems:
                print(f"breaking against {previous[-1].name}: {problem}", file=sys.stderr)
            return 1 if problems else 0
        return 0
    against = args.against or latest_release()
    problems = breaking_changes(load(against), generated())
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(problems)} breaking change(s) against {against.name}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
