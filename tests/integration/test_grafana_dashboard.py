"""deploy/grafana/pollux.json: a valid dashboard whose every query names a metric that exists.

Every PromQL expression of the dashboard (panel targets, template variables, annotations) is
reduced to the metric names it selects by a small tokenizer (unit-tested below); the names
must be exposed by the real services: a scheduler, an agent and a launcher are started as
processes against the session's etcd with `--metrics-listen`, and their /metrics endpoints are
scraped. Exposed names are read from the text format's `# TYPE` lines as Prometheus stores the
series (a counter `x_total`, a histogram `x_bucket` / `x_sum` / `x_count`), so a query with a
wrong suffix fails too. Each row's metrics must come from the service the row is about.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pollux.service.store import Delete, Store
from tests.etcd_server import EtcdServer

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "pollux.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SERVICES = ("scheduler", "agent", "launcher")
EVERY_JOB = 'job=~"$scheduler|$agent|$launcher"'
ROWS: dict[str, tuple[str, frozenset[str]]] = {
    # row title: (job matcher its queries use, services that must expose its metrics)
    "Scheduler": ('job=~"$scheduler"', frozenset({"scheduler"})),
    "RPCs": (EVERY_JOB, frozenset(SERVICES)),
    "Agent": ('job=~"$agent"', frozenset({"agent"})),
    "Launcher": ('job=~"$launcher"', frozenset({"launcher"})),
    "etcd maintenance": ('job=~"$scheduler"', frozenset({"scheduler"})),
    "Audit": (EVERY_JOB, frozenset(SERVICES)),
    "Processes": (EVERY_JOB, frozenset(SERVICES)),
    "Stream limits": ('job=~"$scheduler"', frozenset({"scheduler"})),
}
GRAFANA_VARIABLES = frozenset({"__rate_interval", "__interval", "__range", "__interval_ms"})

# --------------------------------------------------------------------------- PromQL names

AGGREGATIONS = frozenset(
    (
        *("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"),
        *("bottomk", "topk", "quantile", "limitk", "limit_ratio"),
    )
)
FUNCTIONS = AGGREGATIONS | frozenset(
    (
        *("abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh"),
        *("avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh"),
        *("count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg"),
        *("delta", "deriv", "double_exponential_smoothing", "exp", "floor", "histogram_avg"),
        *("histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev"),
        *("histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase"),
        *("info", "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2"),
        *("mad_over_time", "max_over_time", "min_over_time", "minute", "month", "pi"),
        *("predict_linear", "present_over_time", "quantile_over_time", "rad", "rate", "resets"),
        *("round", "scalar", "sgn", "sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc"),
        *("sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan"),
        *("tanh", "time", "timestamp", "vector", "year", "start", "end"),
    )
)
"""PromQL functions and aggregations (and `@ start()` / `@ end()`): an identifier called."""
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
"""Keywords whose parenthesised list holds label names, not metrics."""
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"})
IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
NUMBER = re.compile(r"(?:0[xX][0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)[A-Za-z0-9_]*")
VARIABLE = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z0-9_]+))|\[\[([A-Za-z0-9_]+)\]\]")
NAME_MATCHER = re.compile(r"""__name__\s*(=~|!=|!~|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")
OPEN, CLOSE = ("punct", "("), ("punct", ")")
LABEL_VALUES = re.compile(r"^\s*label_values\s*\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def _skip_string(expr: str, i: int) -> int:
    """The index just past the string literal that starts at `i` ("...", '...' or `...`)."""
    quote = expr[i]
    i += 1
    while i < len(expr):
        if expr[i] == "\\" and quote != "`":
            i += 2
        elif expr[i] == quote:
            return i + 1
        else:
            i += 1
    raise ValueError(f"unterminated string in {expr!r}")


def _skip_group(expr: str, i: int, opening: str, closing: str) -> int:
    """The index just past the bracket closing the one at `i`, strings and nesting honoured."""
    depth = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
            continue
        depth += (c == opening) - (c == closing)
        i += 1
        if depth == 0:
            return i
    raise ValueError(f"unbalanced {opening}{closing} in {expr!r}")


def _skipped(expr: str, i: int) -> int | None:
    """The index past what starts at `i` if it cannot name a metric, else None.

    Whitespace, a comment, a string, a Grafana variable, a range or subquery `[...]`, a
    number or a duration.
    """
    c = expr[i]
    if c.isspace():
        return i + 1
    if c == "#":
        newline = expr.find("\n", i)
        return len(expr) if newline < 0 else newline
    if c in "\"'`":
        return _skip_string(expr, i)
    if c == "$" or expr.startswith("[[", i):
        match = VARIABLE.match(expr, i)
        if match is None:
            raise ValueError(f"bad Grafana variable at {expr[i:]!r}")
        return match.end()
    if c == "[":
        return _skip_group(expr, i, "[", "]")
    if c.isdigit() or (c == "." and expr[i + 1 : i + 2].isdigit()):
        match = NUMBER.match(expr, i)
        assert match is not None
        return match.end()
    return None


def _tokens(expr: str) -> list[tuple[str, str]]:
    """("word", identifier), ("selector", "{...}") and ("punct", character) tokens."""
    tokens = []
    i = 0
    while i < len(expr):
        end = _skipped(expr, i)
        if end is not None:
            i = end
        elif expr[i] == "{":
            end = _skip_group(expr, i, "{", "}")
            tokens.append(("selector", expr[i:end]))
            i = end
        elif (match := IDENTIFIER.match(expr, i)) is not None:
            tokens.append(("word", match.group()))
            i = match.end()
        elif expr[i] in "}]":
            raise ValueError(f"unbalanced {expr[i]} in {expr!r}")
        else:
            tokens.append(("punct", expr[i]))
            i += 1
    depth = 0
    for token in tokens:
        depth += (token == OPEN) - (token == CLOSE)
        if depth < 0:
            break
    if depth:
        raise ValueError(f"unbalanced () in {expr!r}")
    return tokens


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana variables allowed).

    Label matchers `{...}`, ranges and subqueries `[...]`, strings, numbers and durations,
    Grafana variables, comments and the label lists of by / without / on / ignoring /
    group_left / group_right are skipped; an identifier called (followed by `(`, or an
    aggregation followed by by / without) must be a PromQL function; any other identifier
    that is not a keyword is a metric name. A selector `{__name__="x"}` counts as `x`.

    Raises:
        ValueError: An unknown function, unbalanced brackets, an unterminated string, or a
            `__name__` matched by regex or negation (what it selects cannot be checked).
    """
    tokens = _tokens(expr)
    names: set[str] = set()
    k = 0
    while k < len(tokens):
        kind, text = tokens[k]
        following = tokens[k + 1] if k + 1 < len(tokens) else ("", "")
        k += 1
        if kind == "selector":
            for op, quoted in NAME_MATCHER.findall(text):
                if op != "=":
                    raise ValueError(f"__name__{op} selects unknown metrics in {expr!r}")
                names.add(quoted[1:-1])
        elif kind != "word" or text.lower() in KEYWORDS:
            continue
        elif text.lower() in GROUPING:
            if following == OPEN:  # a label list: skip to its ")"
                k = tokens.index(CLOSE, k) + 1
        elif following == OPEN or (text in AGGREGATIONS and following[1].lower() in GROUPING):
            if text not in FUNCTIONS:
                raise ValueError(f"unknown PromQL function {text!r} in {expr!r}")
        else:
            names.add(text)
    return names


def variable_query_names(query: str) -> set[str]:
    """The metrics of a Grafana Prometheus variable query: label_values(selector, label)."""
    match = LABEL_VALUES.match(query)
    if match is None:
        raise ValueError(f"not a label_values(selector, label) query: {query!r}")
    return metric_names(match.group(1))


def exposed_series(text: str) -> set[str]:
    """The series names a Prometheus text-format page exposes, as Prometheus stores them.

    From every `# TYPE name kind` line (present even for a labelled metric with no sample
    yet): a counter is `name_total`, a histogram `name_bucket` / `name_sum` / `name_count`,
    a summary `name` / `name_sum` / `name_count`, anything else `name`. Names of sample
    lines are added as they are.
    """
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            if kind == "counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
            elif kind in ("histogram", "gaugehistogram"):
                names.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
            elif kind == "summary":
                names.update((name, f"{name}_sum", f"{name}_count"))
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('rate(foo_total{job="a"}[5m])', {"foo_total"}),
        (
            "histogram_quantile(0.99, sum by (le, method) "
            '(rate(rpc_seconds_bucket{job=~"$job", method!~"A|B"}[$__rate_interval])))',
            {"rpc_seconds_bucket"},
        ),
        (
            "sum(rate(round_sum[5m])) by (phase) / sum without (instance) (rate(round_count[5m]))",
            {"round_sum", "round_count"},
        ),
        ("a and on (instance) group_left (node) b offset 1h", {"a", "b"}),
        ("a * ON(instance) GROUP_LEFT b", {"a", "b"}),
        ('{__name__="up", job="x"} == bool 1', {"up"}),
        ('label_replace(m, "dst", "$1", "src", "(.*)")', {"m"}),
        ('max(x{l="}{(["}) > 0 # by (not_a_metric) y', {"x"}),
        ("1e3 * scalar(y) + inf - 0x1F / .5", {"y"}),
        ("topk(5, z @ end()) unless w atan2 v", {"z", "w", "v"}),
        ('count_values("value", w)', {"w"}),
        ("max_over_time(rate(c_total[5m])[1h:1m])", {"c_total"}),
        ("increase(d_total[$__range]) > ${threshold} and e[[interval]]", {"d_total", "e"}),
        ("job:rpc_seconds:rate5m", {"job:rpc_seconds:rate5m"}),
        ("vector(1)", set()),
    ],
)
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize(
    ("expr", "complaint"),
    [
        ("rat(x[5m])", "unknown PromQL function 'rat'"),  # a typo for a function
        ('{__name__=~"pollux_.*"}', "selects unknown metrics"),  # cannot be checked
        ("sum(rate(x[5m])", r"unbalanced \(\)"),
        ("x]", "unbalanced ]"),
        ("rate(x[5m)", r"unbalanced \[\]"),
        ('x{job="a}', "unterminated string"),
    ],
)
def test_metric_names_refuses_what_it_cannot_check(expr: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        metric_names(expr)


def test_variable_queries_name_their_selector_only() -> None:
    query = 'label_values(process_start_time_seconds{job=~"$a|$b"}, instance)'
    assert variable_query_names(query) == {"process_start_time_seconds"}
    with pytest.raises(ValueError, match="not a label_values"):
        variable_query_names("query_result(up)")


def test_exposed_series_follow_the_kinds() -> None:
    text = "\n".join(
        [
            "# HELP a_total Things.",
            "# TYPE a_total counter",
            'a_total{x="1"} 1.0',
            "# TYPE b counter",
            "# TYPE h histogram",
            "# TYPE g gauge",
            "# TYPE s summary",
            'loose{x="}"} 2',
        ]
    )
    assert exposed_series(text) == {
        "a_total",
        "b_total",
        "h_bucket",
        "h_sum",
        "h_count",
        "g",
        "s",
        "s_sum",
        "s_count",
        "loose",
    }


# --------------------------------------------------------------------------- the dashboard


def load_dashboard() -> dict[str, Any]:
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard, dict)
    return dashboard


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows included, with a collapsed row's panels after it."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def panels_by_row(dashboard: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The non-row panels under each row title, in dashboard order."""
    rows: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] | None = None
    for panel in all_panels(dashboard):
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], [])
        else:
            assert current is not None, f"panel {panel['title']!r} is above every row"
            current.append(panel)
    return rows


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the dashboard and where it is."""

    where: str
    expr: str
    names: frozenset[str]


def dashboard_queries(dashboard: dict[str, Any]) -> list[Query]:
    """Every query: panel targets, query variables (label_values) and annotations."""
    queries = []
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            expr = target["expr"]
            queries.append(Query(f"panel {panel['title']!r}", expr, frozenset(metric_names(expr))))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            names = frozenset(variable_query_names(text))
            queries.append(Query(f"variable ${variable['name']}", text, names))
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            expr = annotation["expr"]
            names = frozenset(metric_names(expr))
            queries.append(Query(f"annotation {annotation['name']!r}", expr, names))
    return queries


def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_variable() -> None:
    dashboard = load_dashboard()
    assert dashboard["title"]
    assert dashboard["uid"]
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["id"] is None, "an exported dashboard carries no database id"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]
    for annotation in dashboard["annotations"]["list"]:
        if not annotation.get("builtIn"):
            assert annotation["datasource"] == DATASOURCE, annotation["name"]


def test_every_panel_has_a_title_an_id_a_place_and_the_datasource_variable() -> None:
    panels = all_panels(load_dashboard())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel.get("title"), f"panel {panel['id']} has no title"
        pos = panel["gridPos"]
        assert min(pos["w"], pos["h"]) > 0, panel["title"]
        assert 0 <= pos["x"] <= pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} queries nothing"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]
    for p, q in itertools.combinations(panels, 2):
        a, b = p["gridPos"], q["gridPos"]
        apart = (
            a["x"] + a["w"] <= b["x"]
            or b["x"] + b["w"] <= a["x"]
            or a["y"] + a["h"] <= b["y"]
            or b["y"] + b["h"] <= a["y"]
        )
        assert apart, f"panels {p['title']!r} and {q['title']!r} overlap"


def test_each_row_selects_the_jobs_of_its_services() -> None:
    rows = panels_by_row(load_dashboard())
    assert set(rows) == set(ROWS)
    for title, (job, _) in ROWS.items():
        assert rows[title], f"row {title!r} is empty"
        for panel in rows[title]:
            for target in panel["targets"]:
                assert job in target["expr"], (title, panel["title"], target["expr"])


def test_every_query_parses_and_uses_defined_variables() -> None:
    dashboard = load_dashboard()
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    queries = dashboard_queries(dashboard)
    assert len(queries) > 30
    assert all(q.names for q in queries), [q for q in queries if not q.names]
    for query in queries:
        for match in VARIABLE.finditer(query.expr):
            name = next(g for g in match.groups() if g is not None).split(":")[0]
            assert name in variables | GRAFANA_VARIABLES, (query.where, name)


# --------------------------------------------------------------------------- real services


def _wait_for_metrics_port(process: subprocess.Popen[bytes], log: Path, what: str) -> int:
    """The metrics port a service logs in its `server_started` line (it binds port 0)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "server_started":
                return int(event["metrics_port"])
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    raise AssertionError(f"{what} did not start within 60 s:\n{log.read_text()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _delete_root(endpoint: str, root: str) -> None:
    store = await Store.connect(endpoint, root)
    try:
        await store.txn([Delete(root.encode() + b"/", prefix=True)])
    finally:
        await store.close()


@pytest.fixture(scope="module")
def exposed(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, set[str]]]:
    """The series each real service exposes on its metrics endpoint, by service."""
    workdir = tmp_path_factory.mktemp("grafana")
    root = f"/pollux-test/{uuid.uuid4().hex[:12]}"
    common = ["--etcd", etcd.endpoint, "--etcd-root", root]
    common += ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    own = {
        "scheduler": ["--id", "grafana-scheduler"],
        "agent": ["--id", "grafana-agent"],
        "launcher": [
            *("--node-name", "grafana-node", "--gpus", "1"),
            *("--checkpoint-root", str(workdir / "checkpoints")),
            *("--log-root", str(workdir / "replica-logs")),
            *("--scratch-root", str(workdir / "scratch")),
            # A launcher that is not root would share its uid with its replicas: told so.
            *(() if os.geteuid() == 0 else ("--insecure",)),
        ],
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_")}
    processes: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for service in SERVICES:  # all three start at once
            log = workdir / f"{service}.log"
            with log.open("wb") as out:
                command = [sys.executable, "-m", f"pollux.{service}.main", *common, *own[service]]
                process = subprocess.Popen(
                    command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir
                )
            processes[service] = (process, log)
        found = {}
        for service, (process, log) in processes.items():
            port = _wait_for_metrics_port(process, log, service)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                assert reply.status == 200
                found[service] = exposed_series(reply.read().decode())
        yield found
    finally:
        for process, _ in processes.values():
            _stop(process)
        asyncio.run(_delete_root(etcd.endpoint, root))


def test_every_queried_metric_is_exposed_by_the_services(exposed: dict[str, set[str]]) -> None:
    anywhere = set().union(*exposed.values())
    missing = {
        f"{query.where}: {name}"
        for query in dashboard_queries(load_dashboard())
        for name in query.names
        if name not in anywhere
    }
    assert not missing, sorted(missing)


def test_each_row_queries_the_metrics_of_its_services(exposed: dict[str, set[str]]) -> None:
    for title, panels in panels_by_row(load_dashboard()).items():
        _, services = ROWS[title]
        for panel in panels:
            for target in panel["targets"]:
                for name in metric_names(target["expr"]):
                    lacking = sorted(s for s in services if name not in exposed[s])
                    assert not lacking, (
                        f"row {title!r}, {panel['title']!r}: {name} not on {lacking}"
                    )


def test_the_dashboard_covers_every_pollux_metric(exposed: dict[str, set[str]]) -> None:
    """A new pollux_* metric fails this test until a panel of the dashboard queries it."""
    queried = set().union(*(q.names for q in dashboard_queries(load_dashboard())))
    # A histogram is covered when any of its series is queried; `_created` is bookkeeping.
    families = {re.sub(r"_(bucket|sum|count|total|created)$", "", n) for n in queried}
    pollux = {
        n
        for names in exposed.values()
        for n in names
        if n.startswith("pollux_") and not n.endswith("_created")
    }
    uncovered = {n for n in pollux if re.sub(r"_(bucket|sum|count|total)$", "", n) not in families}
    assert not uncovered, sorted(uncovered)
