"""Typed service configuration: frozen dataclasses, one TOML file, environment overrides.

`load(cls, path, env_prefix, overrides)` layers, lowest first: the dataclass defaults, a TOML
file (optional), environment overrides (``<PREFIX>_<SECTION>__<FIELD>``, e.g.
``POLLUX_SCHEDULER_ETCD__ENDPOINT=10.0.0.5:2379``) and explicit overrides by dotted path (the
command-line flags; a flag left out is None and overrides nothing). It converts values to the
declared types and collects *every* problem — an unreadable file, unknown keys, wrong types,
values a dataclass's `problems()` rejects — before raising one `ConfigError` that lists them
with dotted paths. `pollux.service.entry` is the one caller of the services.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pollux.service.etcd_target import EndpointError, split_endpoints

T = TypeVar("T")
_INVALID: Any = object()
"""What `_convert` returns for a value it cannot convert (the problem is recorded)."""


class ConfigError(ValueError):
    """The configuration is invalid; `problems` lists every "path: problem"."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))
        self.problems = problems


def load(
    cls: type[T],
    path: Path | None = None,
    env_prefix: str = "POLLUX",
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build `cls` from defaults, then the TOML file, then the environment, then `overrides`.

    Args:
        cls: The config dataclass.
        path: TOML file, or None for none.
        env_prefix: Environment variables ``<env_prefix>_...`` override the file.
        overrides: Values by dotted field path (``"etcd.endpoint"``); None values are skipped.

    Raises:
        ConfigError: With every problem found.
    """
    raw: dict[str, Any] = {}
    problems: list[str] = []
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            problems.append(f"{path}: no such file")
        except OSError as error:
            problems.append(f"{path}: cannot read: {error.strerror}")
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            problems.append(f"{path}: not valid TOML: {error}")
    _apply_env(raw, env_prefix, os.environ)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set(raw, dotted.split("."), value)
    value = _build(cls, raw, "", problems)
    problems.extend(validate(value, ""))
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, value)


def _set(raw: dict[str, Any], path: list[str], value: Any) -> None:
    node = raw
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def _apply_env(raw: dict[str, Any], prefix: str, env: Mapping[str, str]) -> None:
    head = prefix.upper() + "_"
    for name, text in env.items():
        if not name.startswith(head):
            continue
        path = name[len(head) :].lower().split("__")
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[path[-1]] = text


def _build(cls: Any, raw: Any, where: str, problems: list[str]) -> Any:
    if not isinstance(raw, dict):
        problems.append(f"{where or '<root>'}: expected a table, got {type(raw).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            options = ", ".join(sorted(names))
            problems.append(f"{where}{key}: unknown setting (known: {options})")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        hint = hints[f.name]
        path = f"{where}{f.name}"
        if dataclasses.is_dataclass(hint):
            values[f.name] = _build(hint, raw[f.name], path + ".", problems)
        else:
            converted = _convert(raw[f.name], hint, path, problems)
            if converted is not _INVALID:  # else keep the default, so the rest still validates
                values[f.name] = converted
    return cls(**values)


def _convert(value: Any, hint: Any, path: str, problems: list[str]) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value in (None, "", "none") and type(None) in typing.get_args(hint):
            return None
        return _convert(value, args[0], path, problems)
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            problems.append(f"{path}: expected a list, got {value!r}")
            return _INVALID
        inner = typing.get_args(hint)[0]
        converted = tuple(
            _convert(v.strip() if isinstance(v, str) else v, inner, path, problems)
            for v in items
            if v != ""
        )
        return _INVALID if _INVALID in converted else converted
    try:
        return _scalar(value, hint)
    except (TypeError, ValueError):
        wanted = "a finite float" if hint is float else getattr(hint, "__name__", hint)
        problems.append(f"{path}: expected {wanted}, got {value!r}")
        return _INVALID


def _scalar(value: Any, hint: Any) -> Any:
    """`value` (from TOML or an environment string) as a `hint`; ValueError if it is not one."""
    if hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(value)
    if hint is int and isinstance(value, bool | float):
        raise ValueError(value)
    if hint is float:
        number = float(value)
        if not math.isfinite(number):  # "nan" would pass every `<`/`>=` range check
            raise ValueError(value)
        return number
    if hint in (int, str):
        return hint(value)
    if hint is Path:
        return Path(value)
    return value


def validate(value: Any, where: str = "") -> list[str]:
    """Every problem the `problems()` methods of a config tree report, with dotted paths."""
    problems: list[str] = []
    if not dataclasses.is_dataclass(value):
        return problems
    check = getattr(value, "problems", None)
    if callable(check):
        problems.extend(f"{where}{p}" for p in check())
    for f in dataclasses.fields(value):
        child = getattr(value, f.name)
        if dataclasses.is_dataclass(child):
            problems.extend(validate(child, f"{where}{f.name}."))
    return problems


@dataclasses.dataclass(frozen=True, slots=True)
class EtcdConfig:
    """Where the cluster state lives."""

    endpoint: str = "127.0.0.1:2379"
    """etcd client endpoint, host:port; for a cluster of several members, every member's,
    comma-separated (requests fail over to the next member that answers)."""
    root: str = "/pollux/v1"
    """Key root; several clusters can share one etcd under different roots."""
    timeout_s: float = 5.0
    """Deadline of one etcd request."""

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem"."""
        out = []
        try:
            split_endpoints(self.endpoint)
        except EndpointError as error:
            out.append(f"endpoint: {error}")
        if not self.root.startswith("/") or self.root.endswith("/"):
            out.append(f"root: {self.root!r} must start with '/' and not end with one")
        if self.timeout_s <= 0:
            out.append("timeout_s: must be > 0")
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class ServerConfig:
    """The service's own endpoints."""

    listen: str = "127.0.0.1:0"
    """gRPC bind address, host:port (port 0: any free port)."""
    advertise: str = ""
    """Address other processes dial; empty means the bound address."""
    metrics_listen: str = ""
    """Prometheus endpoint host:port; empty disables it."""
    grace_s: float = 10.0
    """Seconds in-flight RPCs get on shutdown."""
    log_level: str = "info"
    """debug, info, warning or error."""

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem"."""
        out = []
        for name in ("listen", "metrics_listen"):
            value = getattr(self, name)
            if value and not value.rpartition(":")[2].isdigit():
                out.append(f"{name}: {value!r} is not host:port")
        if self.grace_s < 0:
            out.append("grace_s: must be >= 0")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            out.append(f"log_level: {self.log_level!r} is not debug, info, warning or error")
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class TlsConfig:
    """Transport security and authentication of the service's ports and its etcd connection.

    With the three files set, every port speaks TLS and authenticates its callers, and etcd
    is dialled with the certificate as the client identity. Without them a service only
    listens on loopback; `insecure` lets it listen elsewhere in plaintext with no
    authentication, and it says so in a warning on every start.
    """

    ca_file: Path | None = None
    """PEM bundle of the CA that signs the cluster's certificates (peers are checked against it)."""
    cert_file: Path | None = None
    """This service's certificate (PEM); re-read when it changes."""
    key_file: Path | None = None
    """Its private key (PEM)."""
    insecure: bool = False
    """Allow plaintext, unauthenticated ports on non-loopback addresses (never in production)."""

    @property
    def enabled(self) -> bool:
        """Whether TLS and authentication are on."""
        return bool(self.ca_file and self.cert_file and self.key_file)

    def problems(self) -> list[str]:
        """Every invalid value, as "field: problem"."""
        named = [f for f in ("ca_file", "cert_file", "key_file") if getattr(self, f)]
        if named and len(named) < 3:
            missing = sorted({"ca_file", "cert_file", "key_file"} - set(named))
            return [f"{', '.join(missing)}: needed too once {', '.join(named)} is set"]
        return []
