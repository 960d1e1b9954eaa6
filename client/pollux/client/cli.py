"""`pollux-cli`: submit, inspect and manage Pollux jobs from a shell.

A thin layer: parse arguments, call `pollux.client.Client`, format the result
with `pollux.client.format`. Exit codes: 0 success, 1 an error reported by the client or server
(``error: <message>`` on stderr, one indented line per offending field), 2 a usage error,
130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc

from pollux.client import cli_admin
from pollux.client import format as fmt
from pollux.client.client import Client
from pollux.client.config import DEFAULT_SERVER, ConfigFileError, resolve
from pollux.client.errors import InvalidArgumentError, PolluxError
from pollux.client.types import (
    JOB_STATES,
    SCALING_RULES,
    TERMINAL_STATES,
    JobSpec,
    Mount,
    read_job_file,
)

SERVER_ENV = "POLLUX_SERVER"
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Connect = Callable[[argparse.Namespace], Client]

# Submit flags that set one JobSpec key each: (flag, key, type, help).
_SPEC_FLAGS: tuple[tuple[str, str, Callable[[str], Any], str], ...] = (
    ("--name", "name", str, "job name: 1-63 of [a-z0-9-], starting with a letter"),
    ("--batch-size", "initial_batch_size", int, "initial total batch size M0 (LR tuned for it)"),
    ("--max-batch-size", "max_batch_size", int, "largest total batch (default: M0)"),
    ("--min-local-batch-size", "min_local_batch_size", int, "smallest per-GPU batch"),
    ("--max-local-batch-size", "max_local_batch_size", int, "largest per-GPU batch (memory)"),
    ("--max-replicas", "max_replicas", int, "most GPUs the job may use (default: no limit)"),
    ("--max-failures", "max_failures", int, "failed replica exits tolerated (default 3)"),
    ("--stop-grace", "stop_grace_s", int, "seconds from SIGTERM to SIGKILL (default 30)"),
    ("--workdir", "working_dir", str, "working directory of every replica"),
    ("--image", "image", str, "OCI image the replicas run in (the launcher needs a runtime)"),
    ("--shm-size", "shm_size_mb", int, "container /dev/shm size in MiB (default: runtime's)"),
)


# ---- argument types --------------------------------------------------------------------------


def non_negative_int(text: str) -> int:
    """Parse a whole number >= 0 (an argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; use a number >= 0")
    return value


def positive_float(text: str) -> float:
    """Parse a number of seconds > 0 (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def key_value(text: str) -> tuple[str, str]:
    """Parse ``KEY=VALUE``; the value may contain ``=`` and be empty (an argparse type)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def mount(text: str) -> Mount:
    """Parse ``SRC:DST[:ro]`` (an argparse type)."""
    try:
        return Mount.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def job_state(text: str) -> str:
    """Parse a job state name, case-insensitively (an argparse type)."""
    name = text.upper()
    if name not in JOB_STATES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(JOB_STATES)}")
    return name


# ---- parser ----------------------------------------------------------------------------------


def _add_globals(parser: argparse.ArgumentParser, environ: Mapping[str, str], sub: bool) -> None:
    # Subcommands accept the global options too (`pollux-cli ls -o json`); their defaults are
    # suppressed there so that a value given before the subcommand is not overwritten.
    def default(value: object) -> object:
        return argparse.SUPPRESS if sub else value

    parser.add_argument(
        "--server",
        default=default(environ.get(SERVER_ENV)),
        metavar="HOST:PORT[,HOST:PORT]",
        help=f"scheduler replicas to talk to (env {SERVER_ENV}; else the config file's "
        f"context; else {DEFAULT_SERVER})",
    )
    parser.add_argument(
        "--context",
        default=default(None),
        help="context of ~/.config/pollux/config.toml to use (env POLLUX_CONTEXT; "
        "default: its current_context)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=fmt.OUTPUT_FORMATS,
        default=default("table"),
        help="output format (default table)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=default(10.0),
        metavar="SECONDS",
        help="deadline of each call (default 10)",
    )


def _add_spec_arguments(p: argparse.ArgumentParser) -> None:
    """A job's file and flags (submit, estimate)."""
    p.add_argument("-f", "--file", help="job file: YAML, JSON or TOML with JobSpec keys")
    for flag, key, kind, help_text in _SPEC_FLAGS:
        p.add_argument(
            flag,
            dest=key,
            type=non_negative_int if kind is int else kind,
            metavar="N" if kind is int else flag.lstrip("-").upper(),
            help=help_text,
        )
    p.add_argument("--scaling-rule", choices=SCALING_RULES, help="LR scaling rule")
    p.add_argument(
        "--env", type=key_value, action="append", default=[], metavar="K=V", help="repeatable"
    )
    p.add_argument(
        "--label", type=key_value, action="append", default=[], metavar="K=V", help="repeatable"
    )
    p.add_argument(
        "--mount",
        type=mount,
        action="append",
        default=[],
        metavar="SRC:DST[:ro]",
        help="bind-mount a host directory into the job's container (repeatable; the "
        "launcher must allow SRC)",
    )
    p.add_argument(
        "argv", nargs="*", metavar="-- COMMAND", help="the replica's command line, after --"
    )


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The argument parser; `environ` supplies POLLUX_SERVER (default: os.environ)."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="pollux-cli", description="Submit and inspect jobs on a Pollux cluster."
    )
    _add_globals(parser, env, sub=False)
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_globals(p, env, sub=True)
        return p

    submit = command("submit", "submit a job (flags override the job file)")
    _add_spec_arguments(submit)
    submit.add_argument("--request-id", metavar="ID", help="idempotency key (default: a new UUID)")
    estimate = command(
        "estimate",
        "predict when a job would complete if submitted now (from an earlier run of the same "
        "name: its measured goodput and size)",
    )
    _add_spec_arguments(estimate)

    ls = command("ls", "list jobs")
    ls.add_argument(
        "--state",
        type=job_state,
        action="append",
        default=[],
        help=f"only jobs in this state (repeatable): {', '.join(JOB_STATES)}",
    )
    ls.add_argument("--name-prefix", default="", help="only jobs whose name starts with this")
    ls.add_argument(
        "--label", type=key_value, action="append", default=[], metavar="K=V", help="repeatable"
    )

    describe = command("describe", "show a job: spec, state, allocation and history")
    describe.add_argument("job", metavar="JOB")

    logs = command("logs", "print a replica's log")
    logs.add_argument("job", metavar="JOB")
    logs.add_argument("--rank", type=non_negative_int, default=0, help="replica rank (default 0)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument(
        "--tail", type=non_negative_int, default=0, metavar="N", help="last N lines (0: all)"
    )

    cancel = command("cancel", "stop a job")
    cancel.add_argument("job", metavar="JOB")
    cancel.add_argument("--reason", default="", help="recorded in the job's history")

    delete = command("delete", "remove a finished job")
    delete.add_argument("job", metavar="JOB")

    explain = command("explain", "why a job has the GPUs and batch size it has")
    explain.add_argument("job", metavar="JOB")

    command("nodes", "list nodes with GPUs used/total and their jobs")

    top = command("top", "refreshing cluster view (Ctrl-C to quit)")
    top.add_argument(
        "--interval", type=positive_float, default=2.0, metavar="SECONDS", help="default 2"
    )
    top.add_argument("--once", action="store_true", help="print one screen and exit")

    def sub_parsers(parent: argparse.ArgumentParser, **kwargs: Any) -> Any:
        return parent.add_subparsers(**kwargs)

    cli_admin.add_commands(command, sub_parsers)
    return parser


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    """The submitted spec: the job file (if any), then every flag given on top of it.

    `env` and `labels` merge key by key (a flag wins over the file for the same key);
    ``--mount`` entries are added after the file's; the command after ``--`` replaces the
    file's command.

    Raises:
        JobSpecError: The file or the merged result is not a valid spec.
    """
    data: dict[str, Any] = dict(read_job_file(args.file)) if args.file else {}
    for _, key, _, _ in _SPEC_FLAGS:
        if (value := getattr(args, key)) is not None:
            data[key] = value
    if args.scaling_rule is not None:
        data["scaling_rule"] = args.scaling_rule
    for key, pairs in (("env", args.env), ("labels", args.label)):
        if pairs:
            base = data.get(key)
            merged = dict(base) if isinstance(base, Mapping) else {}
            merged.update(pairs)
            data[key] = merged
    if args.mount:
        base_mounts = data.get("mounts")
        data["mounts"] = [*(base_mounts if isinstance(base_mounts, list) else []), *args.mount]
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv:
        data["command"] = argv
    return JobSpec.from_mapping(data)


# ---- commands --------------------------------------------------------------------------------


def _print(text: str) -> None:
    print(text, flush=True)


def _emit(args: argparse.Namespace, value: Any, table: Callable[[], str]) -> None:
    _print(table() if args.output == "table" else fmt.render_data(value, args.output))


def _now() -> datetime:
    return datetime.now(UTC)


def _submit(args: argparse.Namespace, client: Client) -> None:
    job = client.submit(spec_from_args(args), request_id=args.request_id)
    _emit(args, job, lambda: fmt.submitted_text(job))


def _estimate(args: argparse.Namespace, client: Client) -> None:
    found = client.estimate(spec_from_args(args))
    _emit(args, found, lambda: fmt.estimate_text(found, _now()))


def _ls(args: argparse.Namespace, client: Client) -> None:
    jobs = list(
        client.list_jobs(
            states=args.state or None, name_prefix=args.name_prefix, labels=dict(args.label)
        )
    )
    _emit(args, jobs, lambda: fmt.jobs_table(jobs, _now()))


def _describe(args: argparse.Namespace, client: Client) -> None:
    job = client.get_job(args.job)
    _emit(args, job, lambda: fmt.job_details(job, _now()))


def _logs(args: argparse.Namespace, client: Client) -> None:
    for line in client.logs(args.job, args.rank, follow=args.follow, tail_lines=args.tail):
        print(line, flush=args.follow)


def _cancel(args: argparse.Namespace, client: Client) -> None:
    job = client.cancel(args.job, reason=args.reason)
    _emit(args, job, lambda: f"{job.id}\t{job.state}\tcancel requested")


def _delete(args: argparse.Namespace, client: Client) -> None:
    client.delete(args.job)
    _emit(args, {"deleted": args.job}, lambda: f"deleted {args.job}")


def _explain(args: argparse.Namespace, client: Client) -> None:
    explanation = client.explain(args.job)
    _emit(args, explanation, lambda: fmt.explanation_text(explanation))


def _nodes(args: argparse.Namespace, client: Client) -> None:
    cluster = client.cluster_status()
    _emit(args, cluster.nodes, lambda: fmt.nodes_table(cluster))


def _top(args: argparse.Namespace, client: Client) -> None:
    active = [s for s in JOB_STATES if s not in TERMINAL_STATES]
    clear = sys.stdout.isatty() and not args.once and args.output == "table"
    while True:
        cluster = client.cluster_status()
        jobs = list(client.list_jobs(states=active))
        frame = {"cluster": cluster, "jobs": jobs}
        text = (
            fmt.top_text(cluster, jobs, _now())
            if args.output == "table"
            else fmt.render_data(frame, args.output)
        )
        # Home the cursor and clear the screen in one write, so the view does not flicker.
        _print(("\x1b[H\x1b[2J" if clear else "") + text)
        if args.once:
            return
        time.sleep(args.interval)
        if not clear and args.output == "table":
            _print("")


COMMANDS: dict[str, Callable[[argparse.Namespace, Client], None]] = {
    "submit": _submit,
    "estimate": _estimate,
    "ls": _ls,
    "describe": _describe,
    "logs": _logs,
    "cancel": _cancel,
    "delete": _delete,
    "explain": _explain,
    "nodes": _nodes,
    "top": _top,
    **cli_admin.COMMANDS,
}


# ---- entry point -----------------------------------------------------------------------------


def error_lines(error: PolluxError) -> list[str]:
    """``error: <message>`` and one indented ``<field>: <problem>`` line per violation.

    A server message that already lists every violation is cut to its headline, so that
    each problem is printed once.
    """
    violations = error.violations if isinstance(error, InvalidArgumentError) else ()
    message = error.message
    if violations and all(f"{f}: {d}" in message for f, d in violations):
        message = message.split(":", 1)[0]
    return [f"error: {message}", *(f"  {f or '(spec)'}: {d}" for f, d in violations)]


def _connect(args: argparse.Namespace) -> Client:
    """The client of the resolved context (pollux.client.config): flags, env, config file."""
    try:
        context = resolve(os.environ, server=args.server, context=args.context)
    except ConfigFileError as error:
        raise ValueError(str(error)) from error
    credentials = None
    if context.ca_file is not None:
        try:
            credentials = grpc.ssl_channel_credentials(context.ca_file.read_bytes())
        except OSError as error:
            raise ValueError(
                f"cannot read the CA file {context.ca_file}: {error.strerror}"
            ) from error
    return Client(
        context.server, timeout_s=args.timeout, credentials=credentials, token=context.token
    )


def main(argv: Sequence[str] | None = None, *, connect: Connect = _connect) -> int:
    """Entry point of ``pollux-cli``; returns the process exit code.

    Args:
        argv: Arguments without the program name; None means ``sys.argv[1:]``.
        connect: Makes the client from the parsed arguments (tests pass a fake).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, or a usage error argparse already printed
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    try:
        client = connect(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with client:
            COMMANDS[args.command_name](args, client)
    except PolluxError as error:
        print("\n".join(error_lines(error)), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`pollux-cli logs JOB | head`); stop quietly, and keep Python
        # from complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
