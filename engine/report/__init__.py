"""Reports and listings of runs and experiments, read from the store.

`write_report` writes one self-contained HTML file (plotly, the `report` extra, imported only
when a report is written); `run_record` and `experiment_record` are the JSON records that
`carl runs --json` and `carl experiments --json` print, one a line.
"""

from .build import MISSING_PLOTLY, write_report
from .records import (
    ReportError,
    arm_summary,
    experiment_record,
    find_experiment,
    find_run,
    mean_ci,
    run_record,
)

__all__ = [
    "MISSING_PLOTLY",
    "ReportError",
    "arm_summary",
    "experiment_record",
    "find_experiment",
    "find_run",
    "mean_ci",
    "run_record",
    "write_report",
]
