"""Hyper-parameter search on Pollux: Optuna studies whose trials are Pollux jobs.

A sweep (`SweepSpec`, from a sweep file) names a search space, an objective metric, a job
template and how many trials run at once; `pollux.hpo.driver.run_sweep` runs it against a
`TrialBackend` (the live cluster: `pollux.client.sweep`; the simulator:
`pollux.sim.trials`). Trials report metrics by printing `report_metric` lines. The driver
needs Optuna (the ``hpo`` extra); this package's top level does not, so a training job can
import `report_metric` without it. docs/hpo.md is the user's guide.
"""

from pollux.hpo.metrics import MetricReport, format_metric_line, parse_metric_line, report_metric
from pollux.hpo.spec import Parameter, SweepSpec, SweepSpecError

__all__ = [
    "MetricReport",
    "Parameter",
    "SweepSpec",
    "SweepSpecError",
    "format_metric_line",
    "parse_metric_line",
    "report_metric",
]
