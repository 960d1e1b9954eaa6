"""`pollux-cli whoami`, `usage` and `admin ...`: identities, tenants, usage and the audit log.

Kept apart from `pollux.client.cli` (jobs) so each stays readable; `cli` adds these commands to
its parser with `add_commands` and dispatches to `COMMANDS`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from pollux.client import format as fmt
from pollux.client.cli_jobs import since_time
from pollux.client.client import Client

Command = Callable[[str, str], argparse.ArgumentParser]
"""Makes a subcommand with the global options: (name, help) → parser."""
T = TypeVar("T")


def _duration(text: str) -> int:
    """Seconds from ``90``, ``90s``, ``30m``, ``12h``, ``30d`` (an argparse type)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = int(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration like 3600, 12h or 30d"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value * units[unit]


def _day(text: str) -> datetime:
    """A UTC day, YYYY-MM-DD (an argparse type)."""
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day like 2026-11-01") from None


def _since(text: str) -> datetime:
    """``--since`` of `usage`: a UTC day, or what ``logs --since`` takes (an argparse type)."""
    try:
        return _day(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        return since_time(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a day (2026-11-01), a duration (90m, 2h, 7d) nor an ISO 8601 "
            "time (2026-11-24T09:00)"
        ) from None


def add_commands(command: Command, sub_parsers: Callable[..., Any]) -> None:
    """Add `whoami`, `usage` and the `admin` tree to the CLI's parser."""
    command("whoami", "who the scheduler takes you for")
    usage = command("usage", "GPU-hours and goodput-hours per tenant and user")
    usage.add_argument("--tenant", default="", help="only this tenant (admins)")
    usage.add_argument("--user", default="", help="only this user (admins; users see their own)")
    usage.add_argument(
        "--since",
        type=_since,
        metavar="DAY|DURATION|TIME",
        help="from this day (UTC, YYYY-MM-DD), or since 90m, 2h, 7d ago, or an ISO 8601 time "
        "(as logs --since); usage is kept per day, so this counts from that day's start",
    )

    admin = command("admin", "manage tokens and tenants, read the audit log (admin role)")
    areas = sub_parsers(admin, dest="admin_area", required=True, metavar="AREA")

    token = areas.add_parser("token", help="API tokens").add_subparsers(
        dest="admin_action", required=True, metavar="ACTION"
    )
    create = token.add_parser("create", help="issue a token (printed once)")
    create.add_argument("user")
    create.add_argument("--role", choices=("user", "admin"), default="user")
    create.add_argument("--tenant", default="", help="the user's tenant (must exist)")
    create.add_argument("--ttl", type=_duration, default=0, help="lifetime, e.g. 90d (0: never)")
    create.add_argument("--description", default="")
    revoke = token.add_parser("revoke", help="revoke a token")
    revoke.add_argument("token_id", metavar="TOKEN_ID")
    listing = token.add_parser("ls", help="list tokens")
    listing.add_argument("--user", default="")

    tenant = areas.add_parser("tenant", help="tenants and their GPU shares").add_subparsers(
        dest="admin_action", required=True, metavar="ACTION"
    )
    put = tenant.add_parser("put", help="create or replace a tenant")
    put.add_argument("name")
    put.add_argument("--guarantee", type=int, default=0, help="GPUs guaranteed under demand")
    put.add_argument("--weight", type=float, default=1.0, help="share of the rest (default 1)")
    put.add_argument("--cap", type=int, default=0, help="most GPUs at once (0: no cap)")
    remove = tenant.add_parser("rm", help="remove a tenant")
    remove.add_argument("name")
    tenant.add_parser("ls", help="list tenants")

    audit = areas.add_parser("audit", help="the newest audit records")
    audit.set_defaults(admin_action="ls")
    audit.add_argument("--limit", type=int, default=50)


def _data(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def _emit(args: argparse.Namespace, data: Any, table: Callable[[], str]) -> None:
    """Print `table()` (its cells escaped unless ``--raw``: `_escaped`), or `data` as JSON/YAML."""
    text = table() if args.output == "table" else fmt.render_data(data, args.output)
    print(fmt.for_terminal(text, raw=args.raw), flush=True)


def _escaped(args: argparse.Namespace, value: T) -> T:
    """`value` (messages, lists of them) with every string escaped, unless ``--raw``."""
    return value if args.raw else fmt.escaped(value)


def _whoami(args: argparse.Namespace, client: Client) -> None:
    got = client.whoami()
    me = _escaped(args, got)
    _emit(
        args,
        _data(got),
        lambda: (
            f"{me.name} ({me.role}{', tenant ' + me.tenant if me.tenant else ''}; via {me.via})"
        ),
    )


def _usage(args: argparse.Namespace, client: Client) -> None:
    got = client.usage(tenant=args.tenant, user=args.user, since=args.since)
    rows = _escaped(args, got)
    _emit(
        args,
        [_data(r) for r in got],
        lambda: fmt.table(
            ("TENANT", "USER", "GPU-HOURS", "GOODPUT-HOURS"),
            (
                (
                    r.tenant or "-",
                    r.user,
                    f"{r.gpu_seconds / 3600:.2f}",
                    f"{r.goodput_seconds / 3600:.2f}",
                )
                for r in rows
            ),
        ),
    )


def _admin(args: argparse.Namespace, client: Client) -> None:
    area, action = args.admin_area, args.admin_action
    if area == "token" and action == "create":
        got = client.create_token(
            args.user,
            role=args.role,
            tenant=args.tenant,
            ttl_s=args.ttl,
            description=args.description,
        )
        made = _escaped(args, got)
        _emit(
            args,
            {"token": _data(got.token), "secret": got.secret},
            lambda: (
                f"token {made.token.id} for {made.token.user} ({made.token.role}); "
                f"give them this, it is not shown again:\n{made.secret}"
            ),
        )
    elif area == "token" and action == "revoke":
        client.revoke_token(args.token_id)
        _emit(args, {"revoked": args.token_id}, lambda: f"revoked {_escaped(args, args.token_id)}")
    elif area == "token":
        got_tokens = client.list_tokens(args.user)
        tokens = _escaped(args, got_tokens)
        _emit(
            args,
            [_data(t) for t in got_tokens],
            lambda: fmt.table(
                ("ID", "USER", "ROLE", "TENANT", "EXPIRES", "DESCRIPTION"),
                (
                    (
                        t.id,
                        t.user,
                        t.role,
                        t.tenant or "-",
                        t.expire_time.ToJsonString() if t.HasField("expire_time") else "never",
                        t.description or "-",
                    )
                    for t in tokens
                ),
            ),
        )
    elif area == "tenant" and action == "put":
        stored = client.put_tenant(
            args.name, guarantee_gpus=args.guarantee, weight=args.weight, cap_gpus=args.cap
        )
        name = _escaped(args, stored.name)
        _emit(args, _data(stored), lambda: f"tenant {name} saved")
    elif area == "tenant" and action == "rm":
        client.delete_tenant(args.name)
        _emit(args, {"deleted": args.name}, lambda: f"deleted tenant {_escaped(args, args.name)}")
    elif area == "tenant":
        got_tenants = client.list_tenants()
        tenants = _escaped(args, got_tenants)
        _emit(
            args,
            [_data(t) for t in got_tenants],
            lambda: fmt.table(
                ("NAME", "GUARANTEE", "WEIGHT", "CAP"),
                ((t.name, t.guarantee_gpus, f"{t.weight:g}", t.cap_gpus or "-") for t in tenants),
            ),
        )
    else:
        got_records = client.audit(args.limit)
        records = _escaped(args, got_records)
        _emit(
            args,
            [_data(r) for r in got_records],
            lambda: fmt.table(
                ("TIME", "WHO", "ACTION", "TARGET", "OUTCOME", "FROM"),
                (
                    (
                        r.time.ToJsonString(),
                        r.principal,
                        r.action,
                        r.target or "-",
                        r.outcome,
                        r.peer,
                    )
                    for r in records
                ),
            ),
        )


COMMANDS: dict[str, Callable[[argparse.Namespace, Client], None]] = {
    "whoami": _whoami,
    "usage": _usage,
    "admin": _admin,
}
