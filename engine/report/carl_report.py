"""`carl report`, `carl runs` and `carl experiments`: what the store holds, as a file or as listings.

The listings live here because they print the same records as the report (`run_record`,
`experiment_record`): `--json` is those records, one a line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import paths
from engine.errors import CliError
from engine.text import visible_line

if TYPE_CHECKING:
    from engine.store import StoreReader


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "refs", nargs="+", metavar="RUN|EXPERIMENT", help="run names or ids, or one experiment"
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="the HTML file, or a folder for it (default: ./carl-report-<name>.html)",
    )


def run_report(args: argparse.Namespace, home: Path) -> int:
    from .build import write_report

    db = paths.db_path(home)
    if not db.exists():
        raise CliError(f"no store at {db}: nothing to report")
    print(write_report(db, args.refs, args.output))
    return 0


# `carl runs` on a store without runs: one line, and how to get one.
NO_RUNS = (
    "no runs yet: `carl-tui --demo` (or `carl demo`) trains one, `carl train --config carl.yaml` yours, "
    "`carl observe DIR` imports another tool's"
)


def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object a line")


def list_runs(args: argparse.Namespace, home: Path) -> int:
    reader = _listing_reader(home, "runs", args.json)
    if reader is None:
        return 0
    try:
        if args.json:  # one object a line: `jq`, `pandas.read_json(..., lines=True)`
            from .records import run_record

            for run in reader.runs():
                print(json.dumps(run_record(reader, run)))
            return 0
        rows = [
            (
                str(run.id),
                run.name,
                run.status,
                f"{run.last_step:,}" if run.last_step is not None else "-",
                run.source_kind,
                run.framework or "-",
                run.health or "-",
                run.phase or "-",
            )
            for run in reader.runs()
        ]
        if rows:
            print_table(
                ("ID", "NAME", "STATUS", "STEP", "SOURCE", "FRAMEWORK", "HEALTH", "PHASE"), rows, right=(0, 3)
            )
        else:
            print(NO_RUNS)
    finally:
        reader.close()
    return 0


def add_experiments_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object a line")


def list_experiments(args: argparse.Namespace, home: Path) -> int:
    from .records import experiment_record

    reader = _listing_reader(home, "experiments", args.json)
    if reader is None:
        return 0
    try:
        records = [experiment_record(reader, e) for e in reader.experiments()]
    finally:
        reader.close()
    if args.json:
        for record in records:
            print(json.dumps(record))
        return 0
    if not records:
        print("no experiments yet: `carl experiment` runs one")
        return 0
    for e in records:
        done = e["cell_status"].get("finished", 0)
        print(
            f"{e['id']:>4}  {e['name']:<28} {e['status']:<9} {len(e['arms'])} arms x {len(e['seeds'])} "
            f"seeds, {e['steps']} steps; {done}/{len(e['cells'])} cells finished"
        )
        for arm in e["summary"]:
            print(
                f"        {arm['arm']:<12} task {_mean_ci(arm['task'])}  solved {_mean_ci(arm['solved'])}"
                f"  ({arm['finished']}/{arm['seeds']} seeds)"
            )
    return 0


def _listing_reader(home: Path, what: str, as_json: bool) -> StoreReader | None:
    """The store, read-only, for a listing; None (and a line saying so: on stderr with --json, whose
    stdout stays JSON Lines) when there is no store yet."""
    from engine.store import StoreReader

    db = paths.db_path(home)
    if not db.exists():
        how = f": {NO_RUNS.partition(': ')[2]}" if what == "runs" else ""
        print(f"no {what} yet (no store at {db}){how}", file=sys.stderr if as_json else sys.stdout)
        return None
    return StoreReader(db)


def _mean_ci(figure: dict[str, Any]) -> str:
    """A `mean_ci` as a padded cell: 0.512 [0.401, 0.623]."""
    mean, ci = figure["mean"], figure["ci95"]
    if mean is None:
        return f"{'—':<22}"
    text = f"{mean:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
    return f"{text:<22}"


def print_table(
    header: tuple[str, ...], rows: Sequence[tuple[str, ...]], *, right: tuple[int, ...] = ()
) -> None:
    """Columns as wide as their widest cell (names at most 40), numbers right-aligned, a header line.
    A cell's control characters are written out first (`visible_line`), so a column keeps its width."""
    rows = [tuple(visible_line(cell) for cell in row) for row in rows]
    widths = [min(max(len(r[i]) for r in (header, *rows)), 40) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        out = []
        for i, cell in enumerate(cells):
            cell = cell if len(cell) <= widths[i] else cell[: widths[i] - 1] + "…"
            out.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    print(line(header))
    for row in rows:
        print(line(row))
