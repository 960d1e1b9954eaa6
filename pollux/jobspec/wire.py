"""The job-spec values of `pollux.jobspec` to and from the API's ``JobSpec`` message.

Driven by the table: each key is read and written at its `Field.api_path` according to its
kind, so a key added to the table moves with no code here. A choice travels as its enum's
value ``<ENUM>_<NAME>`` (``SCALING_RULE_LINEAR`` for "linear"): the unspecified value (0) reads
as "" (the default) and a number this side does not know as its digits, which
`pollux.jobspec.check` then refuses by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pollux.jobspec import FIELDS, Field, Kind, Mount, spec_size_problem
from pollux.v1 import types_pb2 as pb


def _parent(message: Any, spec_field: Field) -> Any:
    """The message that holds `spec_field` (``message.batch`` for the batch limits)."""
    for part in spec_field.api_parts[:-1]:
        message = getattr(message, part)
    return message


def values_of(message: pb.JobSpec) -> dict[str, Any]:
    """Every key of `message` as `pollux.jobspec.check` reads it (mounts as `Mount`)."""
    out: dict[str, Any] = {}
    for spec_field in FIELDS:
        value = getattr(_parent(message, spec_field), spec_field.api_parts[-1])
        if spec_field.kind is Kind.ARGV:
            value = tuple(value)
        elif spec_field.kind is Kind.NAMES:
            value = dict(value)
        elif spec_field.kind is Kind.MOUNTS:
            value = tuple(Mount(m.host_path, m.container_path, m.read_only) for m in value)
        elif spec_field.kind is Kind.CHOICE:
            value = _choice_name(_parent(message, spec_field), spec_field.api_parts[-1], value)
        out[spec_field.key] = value
    return out


def _enum(parent: Any, name: str) -> tuple[Any, str]:
    """The enum descriptor of field `name` of `parent`, and its values' prefix."""
    enum = parent.DESCRIPTOR.fields_by_name[name].enum_type
    return enum, re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"


def _choice_name(parent: Any, name: str, number: int) -> str:
    enum, prefix = _enum(parent, name)
    if number == 0:
        return ""
    if number not in enum.values_by_number:
        return str(number)
    return str(enum.values_by_number[number].name).removeprefix(prefix).lower()


def to_message(values: Mapping[str, Any]) -> pb.JobSpec:
    """The ``JobSpec`` message of `values` (keys left out stay unset).

    Raises:
        ValueError: A value does not fit its field: a negative or too large number, or a
            scaling rule that is not one (check the values first).
    """
    out = pb.JobSpec()
    for spec_field in FIELDS:
        if spec_field.key not in values:
            continue
        value = values[spec_field.key]
        parent, name = _parent(out, spec_field), spec_field.api_parts[-1]
        if spec_field.kind is Kind.ARGV:
            getattr(parent, name).extend(value)
        elif spec_field.kind is Kind.NAMES:
            getattr(parent, name).update(value)
        elif spec_field.kind is Kind.MOUNTS:
            for mount in value:
                getattr(parent, name).add(
                    host_path=mount.host_path,
                    container_path=mount.container_path,
                    read_only=mount.read_only,
                )
        elif spec_field.kind is Kind.CHOICE:
            setattr(parent, name, _choice_number(parent, name, value))
        else:
            setattr(parent, name, value)
    return out


def _choice_number(parent: Any, name: str, choice: str) -> int:
    enum, prefix = _enum(parent, name)
    if not choice:
        return 0
    value = enum.values_by_name.get(prefix + choice.upper())
    if value is None:
        raise ValueError(f"{choice!r} is not a value of {enum.name}")
    return int(value.number)


def size_problem(values: Mapping[str, Any]) -> str | None:
    """What to say of the spec `values` when its message is over `MAX_SPEC_BYTES`, else None.

    Raises:
        ValueError: As `to_message` (check the values first).
    """
    return spec_size_problem(to_message(values).ByteSize())
