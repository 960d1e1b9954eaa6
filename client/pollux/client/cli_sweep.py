"""`pollux-cli sweep -f sweep.yaml`: a hyper-parameter search whose trials are Pollux jobs.

Reads and checks the sweep file (`pollux.hpo.SweepSpec`), checks that its job template makes
a valid job, then runs the Optuna study in the foreground (`pollux.hpo.driver.run_sweep` over
`pollux.client.sweep.ClusterTrials`), printing a line as each trial starts and ends and the
best trial at the end (``-o json``: one JSON document at the end). Ctrl-C cancels the running
trials. Needs Optuna: ``pip install 'pollux[hpo]'``. docs/hpo.md is the guide.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from pollux.client import format as fmt
from pollux.client.client import Client
from pollux.client.errors import JobSpecError
from pollux.client.sweep import ClusterTrials, trial_spec
from pollux.hpo.spec import SweepSpec, SweepSpecError

Command = Callable[[str, str], argparse.ArgumentParser]


def add_commands(command: Command) -> None:
    """Add `sweep` to the CLI's parser."""
    sweep = command("sweep", "run a hyper-parameter search: each trial a job (docs/hpo.md)")
    sweep.add_argument(
        "-f", "--file", required=True, type=Path, help="the sweep file (YAML or JSON)"
    )
    sweep.add_argument("--trials", type=int, default=None, help="override the file's trials")
    sweep.add_argument(
        "--concurrency", type=int, default=None, help="override the file's concurrency"
    )


def read_sweep(path: Path, trials: int | None = None, concurrency: int | None = None) -> SweepSpec:
    """Parse and check a sweep file; a relative ``job.working_dir`` is taken from its folder.

    Raises:
        SweepSpecError: The file is unreadable, malformed or invalid (every problem).
    """
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except OSError as error:
        raise SweepSpecError([f"{path}: cannot read: {error.strerror or error}"]) from error
    except (ValueError, yaml.YAMLError) as error:
        raise SweepSpecError([f"{path}: cannot parse: {error}"]) from error
    if not isinstance(data, Mapping):
        raise SweepSpecError([f"{path}: the top level must be a mapping"])
    data = dict(data)
    if trials is not None:
        data["trials"] = trials
    if concurrency is not None:
        data["concurrency"] = concurrency
    job = data.get("job")
    if isinstance(job, Mapping) and isinstance(job.get("working_dir"), str):
        folder = job["working_dir"]
        if folder and not Path(folder).is_absolute() and "${" not in folder:
            data["job"] = {**job, "working_dir": str((path.parent / folder).resolve())}
    return SweepSpec.from_mapping(data)


def _sweep(args: argparse.Namespace, client: Client) -> int:
    try:
        spec = read_sweep(args.file, args.trials, args.concurrency)
        trial_spec(spec.name, 0, spec.sample_job())
    except SweepSpecError as error:
        _problems("invalid sweep file", error.problems)
        return 1
    except JobSpecError as error:
        _problems(
            "the job template makes no valid job (checked with every parameter at its low end)",
            [f"job.{f}: {d}" for f, d in error.violations] or [error.message],
        )
        return 1
    try:
        from pollux.hpo.driver import run_sweep  # noqa: PLC0415 (Optuna is an optional extra)
    except ImportError:
        print(
            "error: pollux-cli sweep needs Optuna; install it with: pip install 'pollux[hpo]'",
            file=sys.stderr,
        )
        return 1
    import optuna  # noqa: PLC0415

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table = args.output == "table"

    def on_event(kind: str, outcome: Any, details: Mapping[str, Any]) -> None:
        if not table:
            return
        if kind == "started":
            params = _params(details["params"])
            print(f"trial {details['number']} started: job {details['job']}  {params}", flush=True)
        else:
            value = "" if outcome.value is None else f"{spec.metric}={outcome.value:g}"
            why = f" ({outcome.reason})" if outcome.reason else ""
            line = f"trial {outcome.number} {outcome.state}: {value}{why}"
            print(fmt.for_terminal(line, raw=args.raw), flush=True)

    def say(line: str) -> None:
        print(fmt.for_terminal(line, raw=args.raw), file=sys.stderr, flush=True)

    backend = ClusterTrials(client, spec.name, spec.poll_interval_s, say=say)
    result = run_sweep(spec, backend, on_event=on_event)
    best = result.best
    if table:
        counts = {
            s: sum(1 for t in result.trials if t.state == s) for s in ("COMPLETE", "PRUNED", "FAIL")
        }
        print(
            f"sweep {spec.name}: {counts['COMPLETE']} complete, {counts['PRUNED']} pruned, "
            f"{counts['FAIL']} failed"
        )
        if best is None:
            print("no trial completed")
        else:
            print(
                f"best: trial {best.number} {spec.metric}={best.value:g} "
                f"(job {best.job})  {_params(best.params)}"
            )
    else:
        data = {
            "sweep": spec.name,
            "metric": spec.metric,
            "direction": spec.direction,
            "best": None if best is None else _outcome(best),
            "trials": [_outcome(t) for t in result.trials],
        }
        print(fmt.render_data(data, args.output))
    return 0 if best is not None else 1


def _outcome(t: Any) -> dict[str, Any]:
    return {
        "number": t.number,
        "state": t.state,
        "value": t.value,
        "job": t.job,
        "params": dict(t.params),
        "reason": t.reason,
    }


def _params(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _problems(headline: str, problems: list[str]) -> None:
    print(f"error: {headline}", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)


COMMANDS: dict[str, Callable[[argparse.Namespace, Client], int | None]] = {"sweep": _sweep}
