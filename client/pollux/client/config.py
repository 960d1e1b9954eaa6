"""Where `pollux-cli` connects and as whom: contexts in ``~/.config/pollux/config.toml``.

Like kubectl's kubeconfig, the file names contexts and the current one; `pollux-up` writes one
for its cluster, so `pollux-cli` works against it with no flags::

    current_context = "local"
    [contexts.local]
    server = "127.0.0.1:7070"  # HOST:PORT[,HOST:PORT...] (`parse_servers`)
    ca_file = "/home/me/.local/share/pollux/pki/ca.pem"  # the CA of its certificate
    token = "pollux_0123456789ab_..."

A setting comes from, first to last: a flag, the environment (``POLLUX_SERVER``, ``POLLUX_CA``,
``POLLUX_TOKEN``, ``POLLUX_CONTEXT``), the context, the default (``127.0.0.1:7070``, plaintext);
never a token from a flag. The file is 0600, written under a lock, atomically (`write_context`).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_SERVER = "127.0.0.1:7070"
DEFAULT_PORT = 7070
"""The scheduler's port in `DEFAULT_SERVER`, suggested when an address has none."""
DEFAULT_SERVER_FROM = "the default address"

_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


class ConfigFileError(ValueError):
    """The config file cannot be used; the message says what to fix."""


class ServerAddressError(ValueError):
    """A scheduler address list that cannot be dialled; the message says what to write."""


def parse_servers(text: str) -> tuple[str, ...]:
    """Split ``HOST:PORT[,HOST:PORT...]`` into distinct targets, checking each one.

    IPv6 hosts go in brackets (``[::1]:7070``). Why strict: gRPC dials port 443 when a
    target has none, so ``localhost`` would fail later with a confusing "connection refused"
    instead of now with what to write.

    Raises:
        ServerAddressError: Naming every bad entry and its fix, or saying that none was given.
    """
    targets: list[str] = []
    problems: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            target = _target(item)
        except ServerAddressError as error:
            problems.append(str(error))
        else:
            if target not in targets:
                targets.append(target)
    if problems:
        raise ServerAddressError("; ".join(problems))
    if not targets:
        raise ServerAddressError(
            f"at least one scheduler address (host:port) is required, e.g. {DEFAULT_SERVER}"
        )
    return tuple(targets)


def _target(item: str) -> str:
    """One ``HOST:PORT`` (``[IPv6]:PORT``) in the form gRPC dials."""
    if "://" in item or item.startswith(("dns:", "unix:", "ipv4:", "ipv6:")):
        rest = (item.split("://", 1)[-1] if "://" in item else item.split(":", 1)[1]).lstrip("/")
        raise ServerAddressError(f"{item!r} has a scheme: write host:port only, e.g. {rest}")
    if item.startswith("["):
        host, sep, port = item[1:].partition("]")
        if not sep:
            raise ServerAddressError(
                f"{item!r} has no closing ']': write e.g. [::1]:{DEFAULT_PORT}"
            )
        if not port:
            raise ServerAddressError(f"{item} has no port: write {item}:{DEFAULT_PORT}")
        if not port.startswith(":"):
            raise ServerAddressError(f"{item!r}: write the port after the bracket, [{host}]:PORT")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ServerAddressError(f"{item!r}: {host!r} is not an IPv6 address") from None
        return f"[{host}]:{_port(item, port[1:])}"
    if item.count(":") > 1:
        # Whether the last group is a port cannot be told ("::1:7070" is an address too).
        raise ServerAddressError(
            f"{item!r}: put an IPv6 address in brackets and the port after them, "
            f"e.g. [::1]:{DEFAULT_PORT}"
        )
    host, sep, port = item.partition(":")
    if not sep:
        if not _HOST.fullmatch(item):
            raise ServerAddressError(f"{item!r} is not host:port")
        raise ServerAddressError(f"{item} has no port: write {item}:{DEFAULT_PORT}")
    if not host:
        raise ServerAddressError(f"{item!r} has no host: write e.g. 127.0.0.1{item}")
    if not _HOST.fullmatch(host):
        raise ServerAddressError(f"{item!r}: {host!r} is not a host name or IPv4 address")
    return f"{host}:{_port(item, port)}"


def _port(item: str, port: str) -> int:
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ServerAddressError(f"{item!r}: port {port!r} is not a number from 1 to 65535")
    return int(port)


@dataclass(frozen=True, slots=True)
class Context:
    """One cluster as a client reaches it."""

    server: str = DEFAULT_SERVER
    ca_file: Path | None = None
    token: str | None = None
    server_from: str = field(default=DEFAULT_SERVER_FROM, compare=False)
    """Where `server` came from, for messages: ``--server``, ``POLLUX_SERVER``, a context."""


def config_path(environ: Mapping[str, str]) -> Path:
    """``$POLLUX_CONFIG``, else ``$XDG_CONFIG_HOME/pollux/config.toml`` (``~/.config/...``)."""
    if environ.get("POLLUX_CONFIG"):
        return Path(environ["POLLUX_CONFIG"])
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "pollux" / "config.toml"


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigFileError(f"cannot read {path}: {error}") from error


def resolve(
    environ: Mapping[str, str], *, server: str | None = None, context: str | None = None
) -> Context:
    """The context to use, from flags, environment and the config file (see the module doc).

    Raises:
        ConfigFileError: An unreadable file, or a context it does not have.
    """
    path = config_path(environ)
    data = _read(path)
    contexts = data.get("contexts", {})
    name = context or environ.get("POLLUX_CONTEXT") or data.get("current_context")
    chosen: dict[str, Any] = {}
    if name:
        if not isinstance(contexts, dict) or name not in contexts:
            known = ", ".join(sorted(contexts)) if isinstance(contexts, dict) else ""
            raise ConfigFileError(
                f"no context {name!r} in {path} (known: {known or 'none'}); "
                "pollux-up writes one, or pass --server"
            )
        chosen = contexts[name] if isinstance(contexts[name], dict) else {}
    ca = environ.get("POLLUX_CA") or chosen.get("ca_file")
    origins = (
        (server, "--server"),
        (environ.get("POLLUX_SERVER"), "POLLUX_SERVER"),
        (chosen.get("server"), f"the server of context {name!r} in {path}"),
    )
    address, origin = next(((a, o) for a, o in origins if a), (DEFAULT_SERVER, DEFAULT_SERVER_FROM))
    return Context(
        server=str(address),
        ca_file=Path(ca) if ca else None,
        token=environ.get("POLLUX_TOKEN") or chosen.get("token") or None,
        server_from=origin,
    )


def current_context(path: Path) -> str | None:
    """The config file's ``current_context``; None if the file or the key is missing."""
    value = _read(path).get("current_context")
    return value if isinstance(value, str) else None


def lock_path(path: Path) -> Path:
    """The lock file beside a config file, which every writer of it holds (`write_context`)."""
    return path.with_name(path.name + ".lock")


def write_context(path: Path, name: str, context: Context, *, current: bool | None = True) -> bool:
    """Add or replace a context in a config file (0600), keeping the others.

    Writers take turns: each holds an exclusive lock on `lock_path` (``flock``) while it
    reads the file, adds its context and replaces the file, so two `pollux-up` started at
    once both keep their contexts. The file is replaced atomically (a temporary file in the
    same directory, fsynced, then renamed over it): a reader sees the old file or the new,
    never part of one.

    Args:
        path: The config file (created with its directory if missing).
        name: The context's name.
        context: Its server, CA file and token.
        current: True: make it the current context; False: keep the current one (the new
            one becomes current only if there is none); None: make it current only if there
            is none or it is already `name`, decided under the lock (what `pollux-up` does,
            so that a cluster started beside another does not take the other's place).

    Returns:
        Whether `name` is the current context afterwards.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _read(path)
        contexts = data.setdefault("contexts", {})
        if not isinstance(contexts, dict):
            raise ConfigFileError(f"cannot update {path}: its contexts are not a table")
        entry: dict[str, str] = {"server": context.server}
        if context.ca_file is not None:
            entry["ca_file"] = str(context.ca_file)
        if context.token:
            entry["token"] = context.token
        contexts[name] = entry
        before = data.get("current_context")
        take = before in (None, name) if current is None else current
        if take or "current_context" not in data:
            data["current_context"] = name
        _replace(path, _render(data))
        return bool(data["current_context"] == name)
    finally:
        os.close(lock)  # releases the lock


def _render(data: dict[str, Any]) -> str:
    lines = [f"current_context = {_quote(str(data['current_context']))}", ""]
    contexts = data["contexts"]
    for context_name in sorted(contexts):
        lines.append(f"[contexts.{_quote(context_name)}]")
        entry = contexts[context_name]
        for key, value in sorted(entry.items() if isinstance(entry, dict) else ()):
            lines.append(f"{key} = {_quote(str(value))}")
        lines.append("")
    return "\n".join(lines)


def _replace(path: Path, text: str) -> None:
    """Write `path` atomically, mode 0600: a temporary file beside it, fsynced, renamed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a crash
    finally:
        os.close(directory)


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
