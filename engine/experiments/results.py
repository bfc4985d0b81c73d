"""An experiment's results: per arm, the held-out figures over seeds, the paired Δ against task-only,
the gate and the final Phi; as one JSON-ready object and as a plain table."""

from __future__ import annotations

from typing import Any

from engine.store import Store, run_lookup

from .arms import GATED_ARMS
from .experiment_runner import Experiment
from .stats import mean_ci, paired_delta

BASELINE = "task-only"


def summarize(store: Store, exp: Experiment) -> dict[str, Any]:
    cells = store.experiment_runs(exp.id)
    names = run_lookup.names(store)
    record = store.experiment(exp.id) or {}
    by_arm = {arm: {c["seed"]: c for c in cells if c["arm"] == arm} for arm in exp.arms}

    def figure(arm: str, key: str) -> list[float | None]:
        return [
            c[key] if c["status"] == "finished" else None
            for c in (by_arm[arm].get(s) for s in exp.seeds)
            if c
        ]

    arms: dict[str, Any] = {}
    for arm in exp.arms:
        runs = [
            {
                "seed": c["seed"],
                "run": names.get(c["run_id"]),
                "run_id": c["run_id"],
                "status": c["status"],
                "task": c["task"],
                "solved": c["solved"],
                "final_phi": c["final_phi"],
                "gate_step": c["gate_step"] if arm in GATED_ARMS else None,
                "error": c["error"],
            }
            for c in (by_arm[arm].get(s) for s in exp.seeds)
            if c
        ]
        entry: dict[str, Any] = {
            "task": mean_ci(figure(arm, "task")),
            "solved": mean_ci(figure(arm, "solved")),
            "final_phi": mean_ci(figure(arm, "final_phi")),
            "gate_steps": [r["gate_step"] for r in runs if r["status"] == "finished"]
            if arm in GATED_ARMS
            else None,
            "finished": sum(r["status"] == "finished" for r in runs),
            "runs": runs,
        }
        if BASELINE in exp.arms and arm != BASELINE:
            entry["delta_task"] = paired_delta(figure(arm, "task"), figure(BASELINE, "task"))
            entry["delta_solved"] = paired_delta(figure(arm, "solved"), figure(BASELINE, "solved"))
        arms[arm] = entry
    return {
        "experiment": exp.name,
        "status": record.get("status"),
        "seeds": exp.seeds,
        "steps": exp.steps,
        "warmup_steps": exp.base.sft_warmup_steps,
        "config": exp.base.name,
        "baseline": BASELINE if BASELINE in exp.arms else None,
        "arms": arms,
    }


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ci(figure: dict[str, Any], digits: int = 3) -> str:
    if figure["mean"] is None:
        return "—"
    if figure["ci95"] is None:
        return _num(figure["mean"], digits)
    lo, hi = figure["ci95"]
    return f"{figure['mean']:.{digits}f} [{lo:.{digits - 1}f}, {hi:.{digits - 1}f}]"


def _delta(delta: dict[str, Any] | None) -> str:
    if delta is None:
        return "(baseline)"
    if delta["mean"] is None:
        return "—"
    text = f"{delta['mean']:+.3f}"
    if delta["ci95"] is not None:
        lo, hi = delta["ci95"]
        text += f" [{lo:+.2f}, {hi:+.2f}]"
    if delta["p"] is not None:
        text += f" p={delta['p']:.2g}"
    return text


def table(summary: dict[str, Any]) -> str:
    """The summary as a plain-text table (mean [95% CI] over seeds), then any cell that did not finish."""
    seeds = summary["seeds"]
    head = (
        f"experiment {summary['experiment']} ({summary['status']}): {len(seeds)} seed(s) "
        f"{', '.join(map(str, seeds))}; {summary['steps']} GRPO steps"
        + (f" from a {summary['warmup_steps']}-step SFT warm-up" if summary["warmup_steps"] else "")
    )
    rows = [("arm", "seeds", "held-out task", "solved", "Δ task vs task-only", "gate opened", "final Φ")]
    for arm, entry in summary["arms"].items():
        gates = entry["gate_steps"]
        gate = "—" if gates is None else (", ".join("never" if g is None else str(g) for g in gates) or "—")
        delta = entry.get("delta_task") if summary["baseline"] else {"mean": None}
        rows.append(
            (
                arm,
                f"{entry['finished']}/{len(seeds)}",
                _ci(entry["task"]),
                _ci(entry["solved"]),
                _delta(delta) if arm != summary["baseline"] else "(baseline)",
                gate,
                _num(entry["final_phi"]["mean"], 4),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head, ""] + [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    lines.append("")
    lines.append("mean [95% CI] over seeds (Student's t); Δ is paired by seed, p from a paired t-test")
    problems = [
        (arm, r) for arm, e in summary["arms"].items() for r in e["runs"] if r["status"] != "finished"
    ]
    for arm, r in problems:
        lines.append(f"  {arm} s{r['seed']}: {r['status']}" + (f": {r['error']}" if r["error"] else ""))
    return "\n".join(lines)
