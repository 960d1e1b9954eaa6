"""pollux-cli's scheduler addresses: what parses, what is refused saying what to write, and
where a bad or unanswered address came from.

Every test runs the real parser and resolver; commands fail before any connection is made.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pollux.client import cli
from pollux.client.client import Client
from pollux.client.config import (
    Context,
    ServerAddressError,
    parse_servers,
    resolve,
    write_context,
)
from pollux.client.errors import UnreachableError

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


pytestmark = pytest.mark.usefixtures("no_user_config")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("127.0.0.1:7070", ("127.0.0.1:7070",)),
        (" a:1, b:2,a:1 ,", ("a:1", "b:2")),
        ("[::1]:7070", ("[::1]:7070",)),
        (
            "sched-0.pollux.svc:7070,[fe80::1%eth0]:1",
            ("sched-0.pollux.svc:7070", "[fe80::1%eth0]:1"),
        ),
        ("h:0065535", ("h:65535",)),
    ],
)
def test_addresses_that_parse(text: str, want: tuple[str, ...]) -> None:
    assert parse_servers(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("localhost", "localhost has no port: write localhost:7070"),
        ("a:1,localhost", "localhost has no port: write localhost:7070"),
        ("[::1]", "[::1] has no port: write [::1]:7070"),
        ("::1", "put an IPv6 address in brackets and the port after them, e.g. [::1]:7070"),
        ("a:0", "'a:0': port '0' is not a number from 1 to 65535"),
        ("a:65536", "port '65536' is not a number from 1 to 65535"),
        ("a:http", "port 'http' is not a number from 1 to 65535"),
        ("a:", "port '' is not a number from 1 to 65535"),
        (":7070", "':7070' has no host: write e.g. 127.0.0.1:7070"),
        ("http://a:1", "'http://a:1' has a scheme: write host:port only, e.g. a:1"),
        ("dns:///a:1", "write host:port only, e.g. a:1"),
        ("my host:1", "'my host' is not a host name or IPv4 address"),
        ("[zz]:1", "'zz' is not an IPv6 address"),
        (" , ", "at least one scheduler address (host:port) is required"),
    ],
)
def test_addresses_that_do_not_parse_say_what_to_write(text: str, want: str) -> None:
    with pytest.raises(ServerAddressError) as caught:
        parse_servers(text)
    assert want in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_every_bad_address_is_named_at_once() -> None:
    with pytest.raises(ServerAddressError) as caught:
        parse_servers("localhost,ok:1,b:99999")
    assert str(caught.value) == (
        "localhost has no port: write localhost:7070; "
        "'b:99999': port '99999' is not a number from 1 to 65535"
    )


def test_the_client_refuses_an_address_without_a_port() -> None:
    with pytest.raises(ValueError, match="localhost has no port: write localhost:7070"):
        Client("localhost")
    with Client(["[::1]:7070", "b:1"]) as client:
        assert client.targets == ("[::1]:7070", "b:1")


def never_connect(args: argparse.Namespace) -> Any:
    raise AssertionError("a bad address must be refused before connecting")


@pytest.mark.parametrize(
    ("argv", "env", "want"),
    [
        (
            ["--server", "localhost"],
            {},
            "error: --server: localhost has no port: write localhost:7070",
        ),
        (
            [],
            {"POLLUX_SERVER": "sched:99999"},
            "error: POLLUX_SERVER: 'sched:99999': port '99999' is not a number from 1 to 65535",
        ),
    ],
    ids=["flag", "environment"],
)
def test_the_cli_says_where_a_bad_address_came_from(
    argv: list[str], env: dict[str, str], want: str, monkeypatch, capsys
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main([*argv, "ls"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [want]


def test_a_bad_address_in_a_context_names_the_context(tmp_path: Path, capsys) -> None:
    write_context(tmp_path / "config.toml", "lab", Context("localhost"))
    assert cli.main(["nodes"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: the server of context 'lab' in {tmp_path / 'config.toml'}: ")
    assert err.rstrip().endswith("localhost has no port: write localhost:7070")


def test_resolve_records_where_the_server_came_from(tmp_path: Path) -> None:
    env = {"POLLUX_CONFIG": str(tmp_path / "config.toml")}
    assert resolve(env).server_from == "the default address"
    write_context(tmp_path / "config.toml", "lab", Context("s:1"))
    assert resolve(env).server_from.startswith("the server of context 'lab'")
    assert resolve({**env, "POLLUX_SERVER": "e:1"}).server_from == "POLLUX_SERVER"
    assert resolve({**env, "POLLUX_SERVER": "e:1"}, server="f:1").server_from == "--server"


# ---- no scheduler: the message (the real connections are tests/integration) ------------------


@pytest.mark.parametrize(
    ("server_from", "cause", "want_note"),
    [
        ("the default address", "connection refused", "(the default address; connection refused)"),
        ("--server", "", "(from --server)"),
        (
            "the server of context 'lab' in /c.toml",
            "",
            "(from the server of context 'lab' in /c.toml)",
        ),
        (None, "", ""),
    ],
)
def test_no_scheduler_message_says_where_and_what_to_do(
    server_from: str | None, cause: str, want_note: str
) -> None:
    error = UnreachableError("grpc said so", targets=("127.0.0.1:7070",), cause=cause)
    text = cli.unreachable_message(error, server_from)
    note = f" {want_note}" if want_note else ""
    assert text == (
        f"no scheduler at 127.0.0.1:7070{note}: start one with ./scripts/demo or set "
        "POLLUX_SERVER (or --server, or a context in ~/.config/pollux/config.toml)"
    )
