"""Sweep files: the search space, the objective, the trial job template, and how many at once.

A sweep file (YAML or JSON, read by the caller) is a mapping; `SweepSpec.from_mapping` checks
every key and reports every problem at once, each by its key path. The job template is a job
file's mapping (the keys `pollux-cli submit -f` reads) whose strings may hold placeholders:
``${NAME}`` for parameter NAME, ``${trial}`` for the trial number, ``${sweep}`` for the
sweep's name. A mapping value that is exactly one placeholder takes the value's own type (so
``initial_batch_size: ${batch}`` searches an integer); anywhere else (inside a longer string,
or an item of a list such as ``command``) the value is formatted with `str`. docs/hpo.md
documents the format.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

ParamValue = float | int | str | bool
"""A sampled parameter value."""

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
BUILTINS = ("trial", "sweep")
"""Placeholders every template may use besides the parameters."""

DIRECTIONS = ("minimize", "maximize")
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")
PARAM_TYPES = ("float", "int", "categorical")


class SweepSpecError(ValueError):
    """A sweep file that cannot run, with every problem found.

    Attributes:
        problems: Each problem as "key.path: what is wrong and what to do".
    """

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("invalid sweep: " + "; ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True, slots=True)
class Parameter:
    """One dimension of the search space.

    Attributes:
        name: Its name (the placeholder ``${name}``).
        kind: "float", "int" or "categorical".
        low: Smallest value (float and int).
        high: Largest value (float and int), > low.
        log: Sample on a log scale (float and int; needs low > 0).
        step: Spacing of an int parameter's values (≥ 1), or of a float's (None: continuous).
        choices: The values of a categorical parameter (strings, numbers or booleans).
    """

    name: str
    kind: Literal["float", "int", "categorical"]
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: float | None = None
    choices: tuple[ParamValue, ...] = ()

    def sample_value(self) -> ParamValue:
        """A valid value (the low end, or the first choice), for checking a template."""
        if self.kind == "categorical":
            return self.choices[0]
        return int(self.low) if self.kind == "int" else float(self.low)


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """A validated sweep (see the module docstring).

    Attributes:
        name: 1-40 characters of [a-z0-9-], starting with a letter; trial jobs are named
            "<name>-<trial number>".
        metric: Name of the metric the trials report whose value is the objective.
        direction: "minimize" or "maximize".
        trials: How many trials to run in all, ≥ 1.
        concurrency: Trials running at once, ≥ 1: the one knob; the cluster decides how many
            GPUs each gets.
        parameters: The search space.
        job: The trial job template (a job file mapping with placeholders).
        sampler: "tpe" (Optuna's TPE, default) or "random".
        seed: Seed of the sampler (None: random).
        pruner: "median" (stop a trial whose intermediate value is worse than the median of
            earlier trials at the same step) or "none".
        warmup_steps: Reports a trial makes before the pruner may stop it, ≥ 0.
        startup_trials: Trials that finish before the pruner stops any, ≥ 0.
        poll_interval_s: Seconds between looks at the running trials (cluster), > 0.
    """

    name: str
    metric: str
    direction: Literal["minimize", "maximize"]
    trials: int
    concurrency: int
    parameters: tuple[Parameter, ...]
    job: Mapping[str, Any] = field(hash=False)
    sampler: Literal["tpe", "random"] = "tpe"
    seed: int | None = None
    pruner: Literal["median", "none"] = "median"
    warmup_steps: int = 1
    startup_trials: int = 2
    poll_interval_s: float = 2.0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SweepSpec:
        """Build a spec from a sweep file's mapping, checking every key.

        Raises:
            SweepSpecError: Every unknown, missing or invalid key, by its path, at once.
        """
        return _parse(data)

    def render(self, params: Mapping[str, ParamValue], trial: int) -> dict[str, Any]:
        """The job mapping of trial `trial` with `params` in place of the placeholders."""
        values: dict[str, ParamValue] = {**params, "trial": trial, "sweep": self.name}
        rendered = _substitute(dict(self.job), values)
        assert isinstance(rendered, dict)  # a mapping renders to a mapping
        return rendered

    def sample_job(self) -> dict[str, Any]:
        """Trial 0's job with every parameter at its low end: what a check submits."""
        return self.render({p.name: p.sample_value() for p in self.parameters}, 0)


def placeholders(value: Any) -> set[str]:
    """Names of every ``${NAME}`` in the strings of `value` (nested lists and mappings)."""
    if isinstance(value, str):
        return set(_PLACEHOLDER.findall(value))
    if isinstance(value, Mapping):
        return set().union(*(placeholders(v) for v in value.values()), set())
    if isinstance(value, list | tuple):
        return set().union(*(placeholders(v) for v in value), set())
    return set()


def _substitute(value: Any, values: Mapping[str, ParamValue], *, typed: bool = True) -> Any:
    """`value` with placeholders replaced; list items (argv) always stay strings."""
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value)
        if whole and typed:
            return values[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), value)
    if isinstance(value, Mapping):
        return {k: _substitute(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_substitute(v, values, typed=False) for v in value]
    return value


_KEYS = {
    "name",
    "objective",
    "trials",
    "concurrency",
    "parameters",
    "job",
    "sampler",
    "pruner",
    "poll_interval_s",
}


def _parse(data: Mapping[str, Any]) -> SweepSpec:  # noqa: PLR0912, PLR0915
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise SweepSpecError(["(file): must be a mapping of keys to values"])
    for key in sorted(set(data) - _KEYS):
        problems.append(f"{key}: unknown key (known: {', '.join(sorted(_KEYS))})")
    for key in ("name", "objective", "trials", "parameters", "job"):
        if key not in data:
            problems.append(f"{key}: missing")
    name = data.get("name", "")
    if "name" in data and not (isinstance(name, str) and _NAME.match(name)):
        problems.append("name: 1-40 characters of [a-z0-9-], starting with a letter")
    metric, direction = "", "minimize"
    objective = data.get("objective", {})
    if not isinstance(objective, Mapping):
        problems.append("objective: must be a mapping with metric and direction")
        objective = {}
    for key in sorted(set(objective) - {"metric", "direction"}):
        problems.append(f"objective.{key}: unknown key (known: direction, metric)")
    if "objective" in data:
        metric = objective.get("metric", "")
        if not (isinstance(metric, str) and metric.strip()):
            problems.append("objective.metric: the name of the metric the trials report")
        direction = objective.get("direction", "minimize")
        if direction not in DIRECTIONS:
            problems.append(f"objective.direction: one of {', '.join(DIRECTIONS)}")
    trials = _count(data, "trials", 1, problems, default=1)
    concurrency = _count(data, "concurrency", 1, problems, default=1)
    parameters = _parameters(data.get("parameters", {}), problems)
    sampler_cfg = _section(data, "sampler", {"name", "seed"}, problems)
    sampler = sampler_cfg.get("name", "tpe")
    if sampler not in SAMPLERS:
        problems.append(f"sampler.name: one of {', '.join(SAMPLERS)}")
    seed = sampler_cfg.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        problems.append("sampler.seed: a whole number ≥ 0")
    pruner_cfg = _section(data, "pruner", {"name", "warmup_steps", "startup_trials"}, problems)
    pruner = pruner_cfg.get("name", "median")
    if pruner not in PRUNERS:
        problems.append(f"pruner.name: one of {', '.join(PRUNERS)}")
    warmup = _count(pruner_cfg, "warmup_steps", 0, problems, default=1, where="pruner.")
    startup = _count(pruner_cfg, "startup_trials", 0, problems, default=2, where="pruner.")
    poll = data.get("poll_interval_s", 2.0)
    if isinstance(poll, bool) or not isinstance(poll, int | float) or not 0 < poll <= 3600:
        problems.append("poll_interval_s: seconds between looks at the trials, in (0, 3600]")
        poll = 2.0
    job = data.get("job", {})
    if not isinstance(job, Mapping):
        problems.append("job: must be a job file's mapping (the keys of pollux-cli submit -f)")
        job = {}
    known = {p.name for p in parameters} | set(BUILTINS)
    for unknown in sorted(placeholders(job) - known):
        problems.append(
            f"job: placeholder ${{{unknown}}} names no parameter (parameters: "
            f"{', '.join(sorted(p.name for p in parameters)) or 'none'}; also trial, sweep)"
        )
    if "name" in job:
        problems.append("job.name: set by the sweep (<sweep name>-<trial number>); remove it")
    if problems:
        raise SweepSpecError(problems)
    return SweepSpec(
        name=name,
        metric=metric,
        direction=cast(Literal["minimize", "maximize"], direction),
        trials=trials,
        concurrency=concurrency,
        parameters=parameters,
        job=dict(job),
        sampler=sampler,
        seed=seed,
        pruner=pruner,
        warmup_steps=warmup,
        startup_trials=startup,
        poll_interval_s=float(poll),
    )


def _section(
    data: Mapping[str, Any], key: str, known: set[str], problems: list[str]
) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        problems.append(f"{key}: must be a mapping ({', '.join(sorted(known))})")
        return {}
    for extra in sorted(set(value) - known):
        problems.append(f"{key}.{extra}: unknown key (known: {', '.join(sorted(known))})")
    return value


def _count(
    data: Mapping[str, Any],
    key: str,
    least: int,
    problems: list[str],
    *,
    default: int,
    where: str = "",
) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        problems.append(f"{where}{key}: a whole number ≥ {least}")
        return default
    return value


def _parameters(value: Any, problems: list[str]) -> tuple[Parameter, ...]:
    if not isinstance(value, Mapping) or not value:
        problems.append("parameters: a mapping of at least one name to {type, ...}")
        return ()
    out = []
    for name, cfg in value.items():
        where = f"parameters.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            problems.append(f"{where}: names are letters, digits and _ (not first a digit)")
            continue
        if name in BUILTINS:
            problems.append(f"{where}: {name!r} is a built-in placeholder; rename it")
            continue
        if not isinstance(cfg, Mapping):
            problems.append(f"{where}: a mapping with type and its bounds or choices")
            continue
        parameter = _parameter(name, cfg, where, problems)
        if parameter is not None:
            out.append(parameter)
    return tuple(out)


def _parameter(
    name: str, cfg: Mapping[str, Any], where: str, problems: list[str]
) -> Parameter | None:
    kind = cfg.get("type")
    if kind not in PARAM_TYPES:
        problems.append(f"{where}.type: one of {', '.join(PARAM_TYPES)}")
        return None
    if kind != "categorical":
        return _numeric(name, kind, cfg, where, problems)
    for extra in sorted(set(cfg) - {"type", "choices"}):
        problems.append(f"{where}.{extra}: unknown key (categorical: choices)")
    choices = cfg.get("choices")
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, str | int | float | bool) for c in choices)
    ):
        problems.append(f"{where}.choices: a non-empty list of strings, numbers or booleans")
        return None
    return Parameter(name, "categorical", choices=tuple(choices))


def _numeric(
    name: str, kind: str, cfg: Mapping[str, Any], where: str, problems: list[str]
) -> Parameter | None:
    for extra in sorted(set(cfg) - {"type", "low", "high", "log", "step"}):
        problems.append(f"{where}.{extra}: unknown key ({kind}: low, high, log, step)")
    # YAML 1.1 reads 1e-4 (no dot) as text: take such strings as the numbers they spell.
    low, high = _as_number(cfg.get("low")), _as_number(cfg.get("high"))
    number = int if kind == "int" else (int, float)
    if (
        isinstance(low, bool)
        or isinstance(high, bool)
        or not (isinstance(low, number) and isinstance(high, number))
    ):
        problems.append(f"{where}: low and high must be {'whole ' if kind == 'int' else ''}numbers")
        return None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        problems.append(f"{where}: need low < high, got {low} and {high}")
        return None
    log = cfg.get("log", False)
    if not isinstance(log, bool):
        problems.append(f"{where}.log: true or false")
        return None
    if log and low <= 0:
        problems.append(f"{where}.log: a log scale needs low > 0")
        return None
    step = cfg.get("step")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, number) or step <= 0:
            problems.append(f"{where}.step: a number > 0")
            return None
        if log:
            problems.append(f"{where}.step: cannot be combined with log")
            return None
    if kind == "int":
        return Parameter(name, "int", float(low), float(high), log, float(step or 1))
    return Parameter(name, "float", float(low), float(high), log, step)


def _as_number(value: Any) -> Any:
    """`value`, or the int or float a numeric string spells."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                continue
    return value
