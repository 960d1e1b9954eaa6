"""Where `pollux-cli` connects and as whom: contexts in ``~/.config/pollux/config.toml``.

Like kubectl's kubeconfig, the file names contexts — a scheduler address, the CA that signed
its certificate, and a token — and which one is current. `pollux-up` writes one for the
cluster it starts, so `pollux-cli` works against it with no flags::

    current_context = "local"

    [contexts.local]
    server = "127.0.0.1:7070"
    ca_file = "/home/me/.local/share/pollux/pki/ca.pem"
    token = "pollux_0123456789ab_..."

Each setting is taken from, first to last: a flag (``--server``, ``--context``), the
environment (``POLLUX_SERVER``, ``POLLUX_CA``, ``POLLUX_TOKEN``, ``POLLUX_CONTEXT``), the
context, the default (``127.0.0.1:7070``, plaintext). The file holds a secret: it is written
0600 and a token is never taken from the command line (it would show in ``ps``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SERVER = "127.0.0.1:7070"


class ConfigFileError(ValueError):
    """The config file cannot be used; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class Context:
    """One cluster as a client reaches it."""

    server: str = DEFAULT_SERVER
    ca_file: Path | None = None
    token: str | None = None


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
    return Context(
        server=server or environ.get("POLLUX_SERVER") or chosen.get("server") or DEFAULT_SERVER,
        ca_file=Path(ca) if ca else None,
        token=environ.get("POLLUX_TOKEN") or chosen.get("token") or None,
    )


def write_context(path: Path, name: str, context: Context, *, current: bool = True) -> None:
    """Add or replace a context in a config file (0600), keeping the others."""
    data = _read(path)
    contexts = data.setdefault("contexts", {})
    entry: dict[str, str] = {"server": context.server}
    if context.ca_file is not None:
        entry["ca_file"] = str(context.ca_file)
    if context.token:
        entry["token"] = context.token
    contexts[name] = entry
    if current or "current_context" not in data:
        data["current_context"] = name
    lines = [f"current_context = {_quote(data['current_context'])}", ""]
    for context_name in sorted(contexts):
        lines.append(f"[contexts.{_quote(context_name)}]")
        for key, value in sorted(contexts[context_name].items()):
            lines.append(f"{key} = {_quote(str(value))}")
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines))
    os.replace(tmp, path)


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
