r"""`pollux-cli`: submit, inspect and manage Pollux jobs from a shell.

A thin layer: parse arguments, call `pollux.client.Client`, format the result
with `pollux.client.format`. Exit codes: 0 success, 1 an error reported by the client or server
(``error: <message>`` on stderr, one indented line per offending field), 2 a usage error,
130 interrupted with Ctrl-C.

Text from the server (job output, names, reasons) is printed with its control characters
escaped (ESC as ``\x1b``: `pollux.terminal`), so a job's output cannot drive the terminal of
whoever reads it; ``--raw`` prints it as it is.

A setting of a job has one name: the job-file key, which is also the flag with dashes
(`_SPEC_FLAGS`) and the name errors use. ``pollux-cli completion bash|zsh`` prints a shell
completion script made from this parser (`pollux.client.completion`).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, NamedTuple, NoReturn, TypeVar

import grpc

from pollux import jobspec
from pollux.client import cli_admin, cli_jobs, cli_sweep, completion
from pollux.client import format as fmt
from pollux.client.client import Client
from pollux.client.config import (
    DEFAULT_SERVER,
    ConfigFileError,
    ServerAddressError,
    parse_servers,
    resolve,
)
from pollux.client.errors import (
    InvalidArgumentError,
    NotFoundError,
    PolluxError,
    UnreachableError,
)
from pollux.client.types import (
    JOB_STATES,
    SCALING_RULES,
    TERMINAL_STATES,
    Job,
    JobSpec,
    read_job_file,
)
from pollux.jobspec import Mount

SERVER_ENV = "POLLUX_SERVER"
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Connect = Callable[[argparse.Namespace], Client]
T = TypeVar("T")


class SpecFlag(NamedTuple):
    """A job-file key that a flag of `submit`/`estimate` sets: one name for one setting.

    The flag is the key with dashes (`flag`), so a user who knows one knows the other; its
    type and help come from the job-spec contract's table (`pollux.jobspec.FIELDS`), and the
    API's field path of the key is translated back to the key in the errors the CLI prints.
    """

    key: str
    old_flag: str = ""
    """A former spelling, still accepted (hidden) with a deprecation warning."""

    @property
    def flag(self) -> str:
        """``--initial-batch-size`` for ``initial_batch_size``."""
        return "--" + self.key.replace("_", "-")

    @property
    def field(self) -> jobspec.Field:
        """The key's entry in the job-spec contract."""
        return jobspec.BY_KEY[self.key]


# The keys that are flags of their own (env, labels, mounts, scaling_rule and the command have
# flags of other shapes, below), with the former spellings still accepted.
_SPEC_FLAGS: tuple[SpecFlag, ...] = (
    SpecFlag("name"),
    SpecFlag("initial_batch_size", "--batch-size"),
    SpecFlag("max_batch_size"),
    SpecFlag("min_local_batch_size"),
    SpecFlag("max_local_batch_size"),
    SpecFlag("max_replicas"),
    SpecFlag("max_failures"),
    SpecFlag("stop_grace_s", "--stop-grace"),
    SpecFlag("working_dir", "--workdir"),
    SpecFlag("image"),
    SpecFlag("shm_size_mb", "--shm-size"),
)


class _DeprecatedFlag(argparse.Action):
    """A former spelling of a flag: sets the same value and says the new name on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new_flag: str, **kw: Any):
        super().__init__(option_strings, dest, **kw)
        self.new_flag = new_flag

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            f"pollux-cli: warning: {option_string} is deprecated; use {self.new_flag}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


_API_PATH = re.compile(r"\bspec(?:\.[a-z_]+)+")


def file_key_path(field: str) -> str:
    """The job-file key path of an API field path, as the user wrote it.

    ``spec.batch.initial_batch_size`` → ``initial_batch_size``, ``spec.env[A]`` → ``env.A``
    (as the client's own checks name it); a path outside the spec (``request_id``) is
    returned as it is.
    """
    return jobspec.file_path_of(field)


def _file_names(text: str) -> str:
    """`text` with each API field path in it (``set spec.image too``) named by its file key."""
    return _API_PATH.sub(lambda m: file_key_path(m.group(0)), text)


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

# Flags people bring from other schedulers, and what to use instead.
_FOREIGN_FLAGS: dict[str, str] = {
    "--gpus": "Pollux chooses each job's GPU count as it trains; --max-replicas N caps it",
    "--gpu": "Pollux chooses each job's GPU count as it trains; --max-replicas N caps it",
    "--num-gpus": "Pollux chooses each job's GPU count as it trains; --max-replicas N caps it",
    "--nodes": "Pollux places a job's replicas on nodes itself; --max-replicas N caps its GPUs",
    "--batch-size": "--initial-batch-size N is the job's initial total batch size",
}
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


HIDDEN_COMMANDS = frozenset({completion.JOBS_COMMAND})
"""Commands for the completion scripts only: never listed, suggested or completed."""


class _SubCommands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose own parser reports what it did not recognise.

    argparse hands a subcommand's unrecognised arguments back to the top-level parser, which
    then prints the top-level usage; the subcommand's usage is the one that helps.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        extras = vars(namespace).pop(argparse._UNRECOGNIZED_ARGS_ATTR, None)
        if extras:
            chosen = self.choices[values[0]]
            chosen.error(f"unrecognized arguments: {' '.join(extras)}")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors also say what the user probably meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubCommands)

    def error(self, message: str) -> NoReturn:
        super().error(message + "".join(f"\n  hint: {h}" for h in usage_hints(message)))

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # An unknown command lists (and `usage_hints` suggests) the visible commands only.
        choices = action.choices
        if isinstance(action, argparse._SubParsersAction) and value not in (choices or ()):
            shown = ", ".join(repr(c) for c in action.choices if c not in HIDDEN_COMMANDS)
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from {shown})")
        super()._check_value(action, value)


def usage_hints(message: str) -> list[str]:
    """Hints for an argparse usage error: the flag to use instead, the command meant."""
    hints = []
    if message.startswith("unrecognized arguments:"):
        for word in message.split(":", 1)[1].split():
            if (hint := _FOREIGN_FLAGS.get(word.split("=", 1)[0])) is not None:
                hints.append(f"{word.split('=', 1)[0]}: {hint}")
    if (found := _INVALID_CHOICE.search(message)) is not None:
        choices = [c.strip().strip("'") for c in found.group(2).split(",")]
        close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.6)
        if close:
            hints.append(f"did you mean {close[0]!r}?")
    return hints


DISTRIBUTION = "pollux-client"
"""The distribution that installs pollux-cli (client/pyproject.toml)."""

# Values to complete for flags that a type function checks instead of `choices`, by dest.
_COMPLETION_HINTS: dict[str, tuple[str, ...]] = {
    "state": JOB_STATES,
    "file": (completion.FILES,),
    "working_dir": (completion.DIRS,),
    "job": (completion.JOBS,),
}
_COMPLETED_JOBS = 200
"""Newest jobs whose names and ids `pollux-cli __jobs` prints for shell completion."""


def version() -> str:
    """The installed version of the client distribution (what a bug report should quote)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


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
    parser.add_argument(
        "--raw",
        action="store_true",
        default=default(False),
        help="print job output, names and reasons as they are, control characters and escape "
        "sequences included (default: escaped visibly, e.g. \\x1b); only for output you trust",
    )


def _add_spec_arguments(p: argparse.ArgumentParser) -> None:
    """A job's file and flags (submit, estimate)."""
    p.add_argument("-f", "--file", help="job file: YAML, JSON or TOML with JobSpec keys")
    for spec_flag in _SPEC_FLAGS:
        whole = spec_flag.field.kind is jobspec.Kind.COUNT
        kind = non_negative_int if whole else str
        metavar = "N" if whole else spec_flag.key.upper()
        p.add_argument(
            spec_flag.flag,
            dest=spec_flag.key,
            type=kind,
            metavar=metavar,
            help=spec_flag.field.summary,
        )
        if spec_flag.old_flag:
            p.add_argument(
                spec_flag.old_flag,
                dest=spec_flag.key,
                type=kind,
                metavar=metavar,
                action=_DeprecatedFlag,
                new_flag=spec_flag.flag,
                help=argparse.SUPPRESS,
            )
    p.add_argument(
        "--scaling-rule", choices=SCALING_RULES, help=jobspec.BY_KEY["scaling_rule"].summary
    )
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


def _add_cluster_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`nodes`, `dashboard` and `top`: the cluster rather than one job."""
    command("nodes", "list nodes with GPUs used/total and their jobs")
    dashboard = command(
        "dashboard", "print the web dashboard's address, or a job's page on it (JOB)"
    )
    dashboard.add_argument(
        "job", nargs="?", metavar="JOB", help="a job (id, id prefix or name): its page"
    )
    dashboard.add_argument(
        "--link",
        action="store_true",
        help="a one-click sign-in link: your token in the address's #fragment (never sent to "
        "the server, but visible on your screen and in the browser's history)",
    )
    top = command("top", "refreshing cluster view (Ctrl-C to quit)")
    top.add_argument(
        "--interval", type=positive_float, default=2.0, metavar="SECONDS", help="default 2"
    )
    top.add_argument("--once", action="store_true", help="print one screen and exit")


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The argument parser; `environ` supplies POLLUX_SERVER (default: os.environ)."""
    env = os.environ if environ is None else environ
    parser = _Parser(prog="pollux-cli", description="Submit and inspect jobs on a Pollux cluster.")
    _add_globals(parser, env, sub=False)
    parser.add_argument(
        "--version", action="version", version=f"pollux-cli {version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_globals(p, env, sub=True)
        return p

    submit = command("submit", "submit a job (flags override the job file)")
    _add_spec_arguments(submit)
    submit.add_argument("--request-id", metavar="ID", help="idempotency key (default: a new UUID)")
    until_done = submit.add_mutually_exclusive_group()
    until_done.add_argument(
        "--follow",
        action="store_true",
        help="then stream its state changes and rank 0's log, across rescales, until it ends; "
        "exit code: 0 succeeded, 3 failed, 4 cancelled",
    )
    until_done.add_argument(
        "--wait",
        action="store_true",
        help="then wait until it ends, printing its state changes; exit code as --follow",
    )
    estimate = command(
        "estimate",
        "predict when a job would complete if submitted now (from an earlier run of the same "
        "name: its measured goodput and size)",
    )
    _add_spec_arguments(estimate)

    ls = command("ls", "list jobs, active first, newest first")
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
    whose = ls.add_mutually_exclusive_group()
    whose.add_argument("--mine", action="store_true", help="only jobs I submitted")
    whose.add_argument("--user", default="", metavar="USER", help="only USER's jobs (admins)")
    how_many = ls.add_mutually_exclusive_group()
    how_many.add_argument(
        "--limit",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="at most N jobs (default: a screenful)",
    )
    how_many.add_argument("--all", action="store_true", help="every matching job")

    describe = command("describe", "show a job: spec, state, allocation and history")
    describe.add_argument("job", metavar="JOB")

    logs = command("logs", "print a replica's log")
    logs.add_argument("job", metavar="JOB")
    logs.add_argument("--rank", type=non_negative_int, default=0, help="replica rank (default 0)")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="follow the job until it ends: every generation's log across rescales and "
        "restarts, with a marker line at each (waits for a job without a replica yet)",
    )
    logs.add_argument(
        "--tail", type=non_negative_int, default=0, metavar="N", help="last N lines (0: all)"
    )
    logs.add_argument(
        "--since",
        type=cli_jobs.since_time,
        default=None,
        metavar="DURATION|TIME",
        help="only lines written since then: 90s, 10m, 2h, 1d, or an ISO 8601 time",
    )

    cancel = command("cancel", "stop a job")
    cancel.add_argument("job", metavar="JOB")
    cancel.add_argument("--reason", default="", help="recorded in the job's history")

    delete = command("delete", "remove a finished job")
    delete.add_argument("job", metavar="JOB")

    explain = command("explain", "why a job has the GPUs and batch size it has")
    explain.add_argument("job", metavar="JOB")

    _add_cluster_commands(command)

    def sub_parsers(parent: argparse.ArgumentParser, **kwargs: Any) -> Any:
        return parent.add_subparsers(**kwargs)

    cli_admin.add_commands(command, sub_parsers)
    cli_sweep.add_commands(command)
    # For the completion scripts only: no help, so it is neither listed nor completed.
    _add_globals(sub.add_parser(completion.JOBS_COMMAND), env, sub=True)
    shell = command(
        "completion",
        "print a shell completion script: source <(pollux-cli completion bash), or zsh",
    )
    shell.add_argument("shell", choices=completion.SHELLS)
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
    for spec_flag in _SPEC_FLAGS:
        if (value := getattr(args, spec_flag.key)) is not None:
            data[spec_flag.key] = value
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
    if not data.get("working_dir") and not data.get("image"):
        # Where the user submitted from, as a shell runs a command: not the launcher's own
        # directory. A job in a container starts in its image's directory instead.
        data["working_dir"] = os.getcwd()
    return JobSpec.from_mapping(data)


# ---- commands --------------------------------------------------------------------------------


def _print(args: argparse.Namespace, text: str) -> None:
    print(fmt.for_terminal(text, raw=args.raw), flush=True)


def _emit(args: argparse.Namespace, value: T, table: Callable[[T], str], data: Any = None) -> None:
    """Print `value` as a table, its strings escaped unless ``--raw``; or as JSON or YAML.

    `data` is what JSON and YAML show when it is not `value` itself.
    """
    if args.output == "table":
        _print(args, table(value if args.raw else fmt.escaped(value)))
    else:
        _print(args, fmt.render_data(value if data is None else data, args.output))


def _now() -> datetime:
    return datetime.now(UTC)


def _submit(args: argparse.Namespace, client: Client) -> int | None:
    job = client.submit(spec_from_args(args), request_id=args.request_id)
    args.submitted = job.id
    _emit(args, job, fmt.submitted_text)
    if args.follow or args.wait:
        return cli_jobs.follow_job(client, job.id, logs=args.follow, history_from=0, raw=args.raw)
    return None


def _estimate(args: argparse.Namespace, client: Client) -> None:
    found = client.estimate(spec_from_args(args))
    _emit(args, found, lambda f: fmt.estimate_text(f, _now()))


def _ls(args: argparse.Namespace, client: Client) -> None:
    limit = None if args.all else cli_jobs.screenful() if args.limit is None else args.limit
    owner = client.whoami().name if args.mine else args.user
    jobs: list[Job] = []
    seen: set[str] = set()
    # Active jobs first, then the others, each newest first: a screenful shows what runs now
    # however many jobs finished since. Once every active job is listed, the second query
    # asks for as many more as it may repeat; a job listed twice (or finished meanwhile) is
    # shown once.
    for states in _ls_groups(args.state):
        wanted = None if limit is None else limit + 1 - len(jobs)
        if wanted is not None and wanted <= 0:
            break
        for job in client.list_jobs(
            states=states,
            name_prefix=args.name_prefix,
            labels=dict(args.label),
            newest_first=True,
            owner=owner,
            limit=None if wanted is None else wanted + len(seen),
        ):
            if job.id not in seen:
                seen.add(job.id)
                jobs.append(job)
    shown = jobs[:limit]
    _emit(args, shown, lambda js: fmt.jobs_table(js, _now()))
    if limit is not None and len(jobs) > limit and args.output == "table":
        print(cli_jobs.more_jobs_hint(limit), file=sys.stderr)


def _ls_groups(states: Sequence[str]) -> list[list[str] | None]:
    """What `ls` lists in turn: the active states asked for, then the rest.

    Without ``--state`` the rest is every job (None: no filter), so that a job in a state
    this client does not know is listed too; the first group's jobs are not listed twice.
    """
    if not states:
        return [[s for s in JOB_STATES if s not in TERMINAL_STATES], None]
    active = [s for s in states if s not in TERMINAL_STATES]
    finished = [s for s in states if s in TERMINAL_STATES]
    return [group for group in (active, finished) if group]


def _describe(args: argparse.Namespace, client: Client) -> None:
    job = client.get_job(args.job)
    _emit(args, job, lambda j: fmt.job_details(j, _now()))


def _logs(args: argparse.Namespace, client: Client) -> None:
    if args.follow:
        cli_jobs.follow_job(
            client, args.job, rank=args.rank, tail_lines=args.tail, since=args.since, raw=args.raw
        )
        return
    try:
        for chunk in client.log_chunks(args.job, args.rank, tail_lines=args.tail, since=args.since):
            for line in chunk.lines:
                print(fmt.for_terminal(line, raw=args.raw))
    except NotFoundError as error:
        job = client.get_job(args.job)  # a job that does not exist: its own NOT_FOUND
        if job.is_terminal:
            raise
        raise NotFoundError(
            f"job {job.spec.name or job.id} is {job.state} and rank {args.rank} has no log yet "
            f"(no replica started); pollux-cli logs -f {job.id} waits for it",
            error.code,
        ) from error


def _cancel(args: argparse.Namespace, client: Client) -> None:
    job = client.cancel(args.job, reason=args.reason)
    _emit(args, job, lambda j: f"{j.id}\t{j.state}\tcancel requested")


def _delete(args: argparse.Namespace, client: Client) -> None:
    client.delete(args.job)
    _emit(args, {"deleted": args.job}, lambda d: f"deleted {d['deleted']}")


def _explain(args: argparse.Namespace, client: Client) -> None:
    explanation = client.explain(args.job)
    _emit(args, explanation, fmt.explanation_text)


def _nodes(args: argparse.Namespace, client: Client) -> None:
    cluster = client.cluster_status()
    _emit(args, cluster, fmt.nodes_table, data=cluster.nodes)


def _dashboard(args: argparse.Namespace, client: Client) -> int | None:
    url = client.cluster_status().dashboard_url
    if not url:
        print(
            "error: the scheduler that answered serves no dashboard (its dashboard_listen "
            "setting is empty; pollux-up serves one)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    token = getattr(args, "token", None) if args.link else None
    page = f"/jobs/{client.get_job(args.job).id}" if args.job else ""
    _print(args, dashboard_address(url, page, token))
    return None


def dashboard_address(url: str, page: str = "", token: str | None = None) -> str:
    """The dashboard's address at `page` (``/jobs/<id>``; "": its front page).

    The page is the address's fragment (``#/jobs/<id>``); with a token, the sign-in fragment
    carries it as ``next`` (``#token=…&next=/jobs/<id>``), where the page goes once it has
    taken the token out of the address bar.
    """
    if token:
        query = {"token": token, **({"next": page} if page else {})}
        return f"{url}#{urllib.parse.urlencode(query, safe='/')}"
    return f"{url}#{page}" if page else url


def _jobs_for_completion(args: argparse.Namespace, client: Client) -> None:
    """The newest jobs' names, then their ids, one a line (what `@jobs` completes)."""
    jobs = list(client.list_jobs(newest_first=True, limit=_COMPLETED_JOBS))
    words = dict.fromkeys([j.spec.name for j in jobs if j.spec.name] + [j.id for j in jobs])
    for word in words:
        print(fmt.for_terminal(word, raw=False))


def _top(args: argparse.Namespace, client: Client) -> None:
    active = [s for s in JOB_STATES if s not in TERMINAL_STATES]
    clear = sys.stdout.isatty() and not args.once and args.output == "table"
    while True:
        cluster = client.cluster_status()
        jobs = list(client.list_jobs(states=active))
        if args.output == "table":
            printable = (cluster, jobs) if args.raw else fmt.escaped((cluster, jobs))
            text = fmt.top_text(*printable, _now())
        else:
            text = fmt.render_data({"cluster": cluster, "jobs": jobs}, args.output)
        text = fmt.for_terminal(text, raw=args.raw)
        # Home the cursor and clear the screen in one write, so the view does not flicker.
        print(("\x1b[H\x1b[2J" if clear else "") + text, flush=True)
        if args.once:
            return
        time.sleep(args.interval)
        if not clear and args.output == "table":
            print(flush=True)


COMMANDS: dict[str, Callable[[argparse.Namespace, Client], int | None]] = {
    "submit": _submit,
    "estimate": _estimate,
    "ls": _ls,
    "describe": _describe,
    "logs": _logs,
    "cancel": _cancel,
    "delete": _delete,
    "explain": _explain,
    "nodes": _nodes,
    "dashboard": _dashboard,
    "top": _top,
    completion.JOBS_COMMAND: _jobs_for_completion,
    **cli_admin.COMMANDS,
    **cli_sweep.COMMANDS,
}


# ---- entry point -----------------------------------------------------------------------------


_SPEC_COMMANDS = frozenset({"submit", "estimate"})
"""Commands whose errors name the job-file keys the user wrote, not the API's paths."""


def error_lines(error: PolluxError, args: argparse.Namespace | None = None) -> list[str]:
    """``error: <message>`` and one indented ``<field>: <problem>`` line per violation.

    A server message that already lists every violation is cut to its headline, so that
    each problem is printed once. For `submit` and `estimate` (given `args`) fields are named
    by their job-file key (`file_key_path`); a call that reached no scheduler says where the
    address came from and what to do.
    """
    if isinstance(error, UnreachableError):
        return [f"error: {unreachable_message(error, getattr(args, 'server_from', None))}"]
    violations = error.violations if isinstance(error, InvalidArgumentError) else ()
    message = error.message
    if violations and all(f"{f}: {d}" in message for f, d in violations):
        message = message.split(":", 1)[0]
    lines = [f"error: {message}", *(f"  {f or '(spec)'}: {d}" for f, d in violations)]
    if getattr(args, "command_name", None) in _SPEC_COMMANDS:
        lines = [_file_names(line) for line in lines]
    return lines


def unreachable_message(error: UnreachableError, server_from: str | None = None) -> str:
    """What to do when nothing answers: where the address came from, and how to get one."""
    origin = server_from or ""
    if origin and not origin.startswith("the default"):
        origin = f"from {origin}"
    notes = "; ".join(n for n in (origin, error.cause) if n)
    where = ", ".join(error.targets) or "the given address"
    return (
        f"no scheduler at {where}{f' ({notes})' if notes else ''}: start one with "
        f"./scripts/demo or set {SERVER_ENV} (or --server, or a context in "
        "~/.config/pollux/config.toml)"
    )


def _connect(args: argparse.Namespace) -> Client:
    """The client of the resolved context (pollux.client.config): flags, env, config file.

    Its address is checked here, so that ``localhost`` (no port) is a usage error naming
    where it came from rather than a failed dial of port 443.
    """
    # --server defaults to $POLLUX_SERVER; pass it as a flag only when it is not that value,
    # so that errors name the place the user set it.
    flag = args.server if args.server != os.environ.get(SERVER_ENV) else None
    try:
        context = resolve(os.environ, server=flag, context=args.context)
    except ConfigFileError as error:
        raise ValueError(str(error)) from error
    try:
        parse_servers(context.server)
    except ServerAddressError as error:
        raise ValueError(f"{context.server_from}: {error}") from error
    args.server_from = context.server_from
    args.token = context.token  # for `dashboard --link`, which prints it on request
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


def notice_printer(args: argparse.Namespace) -> Callable[[str], None]:
    """What prints the server's notes on stderr, each once (a follow asks many times)."""
    printed: set[str] = set()

    def say(text: str) -> None:
        if text not in printed:
            printed.add(text)
            print(fmt.for_terminal(text, raw=args.raw), file=sys.stderr, flush=True)

    return say


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
    if args.command_name == "completion":  # needs no scheduler
        print(completion.script(parser, args.shell, _COMPLETION_HINTS), end="")
        return 0
    try:
        client = connect(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if hasattr(client, "on_notice"):
        client.on_notice = notice_printer(args)
    try:
        with client:
            code = COMMANDS[args.command_name](args, client)
    except PolluxError as error:
        lines = "\n".join(error_lines(error, args))
        print(fmt.for_terminal(lines, raw=args.raw), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if getattr(args, "follow", False) or getattr(args, "wait", False):
            job = getattr(args, "job", None) or getattr(args, "submitted", None) or "the job"
            print(
                f"\ninterrupted: {job} goes on running (pollux-cli logs -f to follow it again, "
                "pollux-cli cancel to stop it)",
                file=sys.stderr,
            )
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`pollux-cli logs JOB | head`); stop quietly, and keep Python
        # from complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
