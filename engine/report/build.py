"""`carl report RUN|EXPERIMENT [RUN ...]`: one self-contained HTML file.

plotly.js is embedded once (the file opens offline); each chart's figure is a JSON block that a few
lines of script hand to `Plotly.newPlot`. Tables (eval reasons, per-arm results, cells) are plain
HTML. Every string from the store is escaped.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.store.reader import RunRow, StoreReader

from .records import (
    ReportError,
    arm_summary,
    experiment_cells,
    find_experiment,
    find_run,
)
from .run_data import RunData, run_data

if TYPE_CHECKING:
    import plotly.graph_objects as go

MISSING_PLOTLY = "install the report extra: pip install 'carl-tui[report]'"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; } h3 { margin-top: 1.5em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f8; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: #777; } .pass { color: #1a7f37; font-weight: 600; } \
.fail { color: #c62828; font-weight: 600; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.5em 1em; }
.chart { width: 100%; min-height: 360px; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; border-radius: 2px; vertical-align: -0.1em; }
"""

# Draws every chart from its JSON block; kept to a few lines so the file is plotly.js plus data.
BOOT = """
for (const block of document.querySelectorAll("script.carl-figure")) {
  const figure = JSON.parse(block.textContent);
  Plotly.newPlot(block.dataset.chart, figure.data, figure.layout, {responsive: true, displaylogo: false});
}
"""


@dataclass
class Page:
    """The body of the report, built top to bottom."""

    parts: list[str] = field(default_factory=list)
    figures: int = 0
    contents: list[tuple[str, str]] = field(default_factory=list)  # (anchor, title) of each h2

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def section(self, anchor: str, title: str) -> None:
        self.contents.append((anchor, title))
        self.add(f'<h2 id="{anchor}">{_e(title)}</h2>')

    def note(self, text: str) -> None:
        self.add(f'<p class="note">{_e(text)}</p>')

    def chart(self, title: str, fig: go.Figure | None, empty: str) -> None:
        """A titled chart, or the title and a line saying why there is none."""
        self.add(f"<h3>{_e(title)}</h3>")
        if fig is None or not fig.data:
            self.add(f'<p class="muted">{_e(empty)}</p>')
            return
        import plotly.io as pio

        self.figures += 1
        chart_id = f"chart-{self.figures}"
        spec = pio.to_json(fig, validate=False).replace("</", "<\\/")  # no "</script>" inside the block
        self.add(
            f'<div class="chart" id="{chart_id}"></div>\n'
            f'<script type="application/json" class="carl-figure" data-chart="{chart_id}">{spec}</script>'
        )


def _e(value: Any) -> str:
    return html.escape("—" if value is None else str(value))


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "—"


def _table(header: Sequence[str] | None, rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    """Cells are markup (escape them first) except the `numeric` columns, which are formatted here."""
    head = f"<thead><tr>{''.join(f'<th>{_e(h)}</th>' for h in header)}</tr></thead>" if header else ""
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{_e(_num(v))}</td>' if i in numeric else f"<td>{v}</td>"
            for i, v in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table>{head}<tbody>{body}</tbody></table>"


def _ci(figure: dict[str, Any]) -> str:
    """A `mean_ci` as text: 0.512 [0.401, 0.623]."""
    if figure["mean"] is None:
        return "—"
    if figure["ci95"] is None:
        return f"{figure['mean']:.3f}"
    lo, hi = figure["ci95"]
    return f"{figure['mean']:.3f} [{lo:.3f}, {hi:.3f}]"


def _verdict(passed: bool | None) -> str:
    if passed is None:
        return '<span class="muted">no eval</span>'
    return '<span class="pass">passed</span>' if passed else '<span class="fail">failed</span>'


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "report"


# -- resolving what to report ------------------------------------------------------------------


@dataclass
class Subject:
    """What a report is about: one run, several runs, or an experiment and its cells' runs."""

    name: str
    runs: list[tuple[RunRow, str | None, int | None]]  # (run, arm, seed)
    experiment: dict[str, Any] | None = None
    cells: list[dict[str, Any]] = field(default_factory=list)


def resolve(reader: StoreReader, refs: Sequence[str]) -> Subject:
    """Run names or ids, or one experiment's name (or id); an unknown one is a ReportError."""
    if not refs:
        raise ReportError("name a run or an experiment")
    found = [find_run(reader, ref) for ref in refs]
    if len(refs) == 1 and found[0] is None:
        experiment = find_experiment(reader, refs[0])
        if experiment is not None:
            cells = experiment_cells(reader, experiment)
            runs = [
                (run, c["arm"], c["seed"])
                for c in cells
                if c["run_id"] is not None and (run := reader.run(c["run_id"])) is not None
            ]
            return Subject(experiment["name"], runs, experiment, cells)
    missing = [ref for ref, run in zip(refs, found, strict=True) if run is None]
    if missing:
        ref = missing[0]
        if len(refs) > 1 and find_experiment(reader, ref) is not None:
            raise ReportError(f"{ref} is an experiment: report it on its own (carl report {ref})")
        names = ", ".join(r.name for r in reader.runs()[-5:]) or "none yet"
        raise ReportError(f"{ref}: no such run or experiment (newest runs: {names})")
    unique: dict[int, RunRow] = {}
    for run in found:
        assert run is not None
        unique.setdefault(run.id, run)
    named = list(unique.values())
    return Subject("-vs-".join(r.name for r in named), [(r, None, None) for r in named])


# -- the page --------------------------------------------------------------------------------------


def _run_header(data: RunData, colour: str | None) -> str:
    run = data.run
    steps = f"{_num(run.last_step)} of {_num(run.max_steps)}" if run.max_steps else _num(run.last_step)
    rows = [
        ("status", _e(run.status)),
        ("source", _e(run.source_kind)),
        ("backend", _e(run.backend)),
        ("model", _e(run.model)),
        ("steps", _e(steps)),
        ("phase", _e(run.phase)),
        (
            "health",
            _e(run.health) + (f" ({_e('; '.join(run.health_reasons))})" if run.health_reasons else ""),
        ),
        ("started", _e(_when(run.started_at))),
        ("ended", _e(_when(run.ended_at))),
    ]
    if data.arm is not None:
        rows.insert(0, ("arm · seed", f"{_e(data.arm)} · {_e(data.seed)}"))
    if run.error:
        rows.append(("error", _e(run.error)))
    rows.append(("eval", _verdict(data.eval["passed"] if data.eval else None)))
    if colour is not None:
        rows.insert(0, ("colour", f'<span class="swatch" style="background:{colour}"></span>'))
    return _table(None, rows)


def _run_section(page: Page, data: RunData, colour: str, several: bool) -> None:
    from . import charts

    name = data.run.name
    page.section(f"run-{data.run.id}", f"Run {name}")
    page.add(_run_header(data, colour if several else None))
    if not data.has_metrics:
        page.note(f"No metrics yet: run {name} has logged no steps, so there is nothing to chart.")
    else:
        page.chart(
            f"Φ and entropy — {name}", charts.phi_entropy(data, colour), "No Φ or entropy series in this run."
        )
        page.chart(f"Rewards — {name}", charts.rewards(data), "No reward series in this run.")
        opened = f" (opened at step {data.gate_opened})" if data.gate_opened is not None else ""
        page.chart(f"Cascade gate — {name}{opened}", charts.gate(data), "No cascade gate in this run.")
        if data.gate:
            page.add(
                _table(
                    ("step", "state", "multiplier", "reason"),
                    [(g["step"], _e(g["state"]), g["multiplier"], _e(g["reason"])) for g in data.gate[-12:]],
                    numeric=(0, 2),
                )
            )
    figures = data.eval["metrics"] if data.eval else {}
    page.chart(
        f"Held-out eval — {name}",
        charts.eval_figures(figures) if data.eval else None,
        "No figure to chart: see the table." if data.eval else f"No eval of this run yet (carl eval {name}).",
    )
    if data.eval:
        page.add(f"<p>{_verdict(data.eval['passed'])} on {_e(_when(data.eval['created_at']))}</p>")
        page.add(_table(("figure", "value"), [(_e(k), _e(_num(v))) for k, v in figures.items()]))
        page.add("<ul>" + "".join(f"<li>{_e(r)}</li>" for r in data.eval["reasons"]) + "</ul>")


def _comparison(page: Page, runs: Sequence[RunData], palette: Sequence[str]) -> None:
    from . import charts

    page.section("comparison", "Comparison")
    page.add(
        _table(
            ("run", "arm", "seed", "status", "steps", "eval", "task", "solved"),
            [
                (
                    f'<span class="swatch" style="background:{c}"></span> '
                    f'<a href="#run-{d.run.id}">{_e(d.run.name)}</a>',
                    _e(d.arm),
                    _e(d.seed),
                    _e(d.run.status),
                    _e(_num(d.run.last_step)),
                    _verdict(d.eval["passed"] if d.eval else None),
                    _e(_num(d.eval["metrics"].get("task"))) if d.eval else "—",
                    _e(_num(d.eval["metrics"].get("solved"))) if d.eval else "—",
                )
                for d, c in zip(runs, palette, strict=True)
            ],
        )
    )
    empty = [d.run.name for d in runs if not d.has_metrics]
    if empty:
        page.note(f"No metrics yet: {', '.join(empty)}.")
    page.chart("Φ by run", charts.overlay(runs, palette, "phi/mean", "Φ mean"), "No run has a Φ series.")
    page.chart(
        "Entropy by run",
        charts.overlay(runs, palette, "phi/entropy", "entropy (nats)"),
        "No run has an entropy series.",
    )
    page.chart(
        "Reward by run", charts.overlay(runs, palette, "reward", "reward"), "No run has a total reward."
    )
    for key in sorted({k for d in runs for k in d.reward_keys}):
        page.chart(f"Reward {key.split('/')[1]} by run", charts.overlay(runs, palette, key, key), "")
    page.chart(
        "Cascade gate multiplier by run",
        charts.overlay(runs, palette, "cascade/multiplier", "coherence multiplier"),
        "No run has a cascade gate.",
    )


def _experiment(page: Page, subject: Subject) -> None:
    from . import charts

    experiment = subject.experiment
    assert experiment is not None
    cells = subject.cells
    counts: dict[str, int] = {}
    for cell in cells:
        counts[cell["status"]] = counts.get(cell["status"], 0) + 1
    page.section("experiment", f"Experiment {experiment['name']}")
    page.add(
        _table(
            None,
            [
                ("status", _e(experiment["status"])),
                ("arms", _e(", ".join(experiment["arms"]))),
                ("seeds", _e(", ".join(map(str, experiment["seeds"])))),
                ("GRPO steps per arm", _e(experiment["steps"])),
                ("warm-up SFT steps", _e(experiment["warmup_steps"])),
                ("cells", _e(", ".join(f"{n} {s}" for s, n in counts.items()))),
                ("started", _e(_when(experiment["created_at"]))),
            ],
        )
    )
    summary = arm_summary(experiment["arms"], cells)
    page.add("<h3>Held-out results by arm</h3>")
    page.add(
        _table(
            ("arm", "seeds finished", "task reward: mean [95% CI]", "solved share: mean [95% CI]"),
            [
                (
                    _e(a["arm"]),
                    _e(f"{a['finished']} of {a['seeds']}"),
                    _e(_ci(a["task"])),
                    _e(_ci(a["solved"])),
                )
                for a in summary
            ],
        )
    )
    page.add(
        '<p class="muted">Over the seeds whose cell finished: the mean and its 95% Student\'s t '
        "interval; one seed gives a mean without an interval.</p>"
    )
    has_results = any(a["task"]["n"] or a["solved"]["n"] for a in summary)
    page.chart(
        "Held-out task reward by arm",
        charts.arms(summary, cells, "task", "task reward") if has_results else None,
        "No cell has a held-out result yet.",
    )
    page.chart(
        "Held-out solved share by arm",
        charts.arms(summary, cells, "solved", "solved share") if has_results else None,
        "No cell has a held-out result yet.",
    )
    page.add("<h3>Cells</h3>")
    page.add(
        _table(
            ("arm", "seed", "run", "status", "task", "solved", "gate opened", "final Φ", "error"),
            [
                (
                    _e(c["arm"]),
                    c["seed"],
                    f'<a href="#run-{c["run_id"]}">{_e(c["run"])}</a>' if c["run"] else "—",
                    _e(c["status"]),
                    c["task"],
                    c["solved"],
                    c["gate_step"],
                    c["final_phi"],
                    _e(c["error"]),
                )
                for c in cells
            ],
            numeric=(1, 4, 5, 6, 7),
        )
    )
    if not subject.runs:
        page.note("No cell has started a run yet.")


def render(subject: Subject, runs: Sequence[RunData], *, generated: float | None = None) -> str:
    """The whole HTML document."""
    from plotly.offline import get_plotlyjs

    from . import charts

    palette = charts.colours(len(runs))
    page = Page()
    if subject.experiment is not None:
        _experiment(page, subject)
    if len(runs) > 1:
        _comparison(page, runs, palette)
    for data, colour in zip(runs, palette, strict=True):
        _run_section(page, data, colour, len(runs) > 1)
    kind = "experiment" if subject.experiment is not None else ("runs" if len(runs) > 1 else "run")
    contents = "".join(f'<li><a href="#{a}">{_e(t)}</a></li>' for a, t in page.contents)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>carl report: {_e(subject.name)}</title>",
            f"<style>{STYLE}</style>",
            f"<script>{get_plotlyjs()}</script>",
            "</head>",
            "<body>",
            f"<h1>carl report: {_e(subject.name)}</h1>",
            f'<p class="muted">{kind} · generated {_e(_when(generated or time.time()))} by carl-tui</p>',
            f"<nav><ul>{contents}</ul></nav>",
            *page.parts,
            f"<script>{BOOT}</script>",
            "</body>",
            "</html>",
        ]
    )


def write_report(db: Path, refs: Sequence[str], out: Path | None = None) -> Path:
    """Write the report of `refs` (run names or ids, or one experiment) and return its path:
    `out`, a default name inside `out` when it is a folder, or ./carl-report-<name>.html."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise ReportError(MISSING_PLOTLY) from None
    reader = StoreReader(db)
    try:
        subject = resolve(reader, refs)
        runs = [
            run_data(
                reader, run, arm=arm, seed=seed, label=f"{arm} · seed {seed}" if arm is not None else None
            )
            for run, arm, seed in subject.runs
        ]
    finally:
        reader.close()
    document = render(subject, runs)
    name = f"carl-report-{_slug(subject.name)[:80]}.html"
    path = Path.cwd() / name if out is None else (out / name if out.is_dir() else out)
    try:
        path.write_text(document, encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"{path}: cannot write the report ({exc.strerror or exc})") from None
    return path
