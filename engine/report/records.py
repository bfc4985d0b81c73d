"""Runs and experiments as plain JSON-able records: what `carl runs --json` and `carl experiments
--json` print, and what the report tabulates. Everything is read through the store's own helpers
(`StoreReader`, read-only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.coherence.summary import PHI_FROM_GENERATE
from engine.errors import CarlError
from engine.experiments.stats import mean_ci
from engine.store.reader import RunRow, StoreReader


class ReportError(CarlError):
    """A one-line problem with what was asked (an unknown run or experiment, no plotly)."""


# -- runs -------------------------------------------------------------------------------------


def find_run(reader: StoreReader, ref: str) -> RunRow | None:
    """A run by name, else by id (as `carl diagnose` and `carl eval` take it)."""
    runs = reader.runs()
    for run in reversed(runs):
        if run.name == ref:
            return run
    if ref.isdigit():
        return next((r for r in runs if r.id == int(ref)), None)
    return None


def run_record(reader: StoreReader, run: RunRow) -> dict[str, Any]:
    """One run, flat: its row, and the newest eval's verdict, task reward and solved share
    (`eval_*` are null when the run has no eval)."""
    latest = reader.latest_eval(run.id)
    figures = latest["metrics"] if latest else {}
    phi_path = reader.latest_values(run.id, [PHI_FROM_GENERATE]).get(PHI_FROM_GENERATE, (0, None))[1]
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "source_kind": run.source_kind,
        "backend": run.backend,
        "model": run.model,
        "last_step": run.last_step,
        "max_steps": run.max_steps,
        "phase": run.phase,
        "health": run.health,
        "health_reasons": run.health_reasons,
        "error": run.error,
        "started_at": run.started_at,
        "last_update": run.last_update,
        "ended_at": run.ended_at,
        "eval_passed": latest["passed"] if latest else None,
        "eval_task": figures.get("task"),
        "eval_solved": figures.get("solved"),
        "eval_at": latest["created_at"] if latest else None,
        # Where the coherence rewards last got Φ: generate (while sampling) | forward | null (none yet).
        "phi_source": None if phi_path is None else ("generate" if phi_path else "forward"),
    }


# -- experiments ------------------------------------------------------------------------------


def find_experiment(reader: StoreReader, ref: str) -> dict[str, Any] | None:
    found = reader.experiment(ref)
    if found is None and ref.isdigit():
        found = reader.experiment(int(ref))
    return found


def experiment_cells(reader: StoreReader, experiment: dict[str, Any]) -> list[dict[str, Any]]:
    """The experiment's arm x seed cells, each with its run's name (null until it starts)."""
    cells = []
    for cell in reader.experiment_runs(experiment["id"]):
        run = reader.run(cell["run_id"]) if cell["run_id"] is not None else None
        cells.append(
            {
                "arm": cell["arm"],
                "seed": cell["seed"],
                "run_id": cell["run_id"],
                "run": run.name if run else None,
                "status": cell["status"],
                "error": cell["error"],
                "task": cell["task"],
                "solved": cell["solved"],
                "gate_step": cell["gate_step"],
                "final_phi": cell["final_phi"],
                "eval_id": cell["eval_id"],
            }
        )
    return cells


def arm_summary(arms: Sequence[str], cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm, over the seeds whose cell finished: held-out task reward and solved share, each as
    `mean_ci` (the figures `carl experiment` prints)."""
    out = []
    for arm in arms:
        mine = [c for c in cells if c["arm"] == arm]
        done = [c for c in mine if c["status"] == "finished"]
        out.append(
            {
                "arm": arm,
                "seeds": len(mine),
                "finished": len(done),
                "task": mean_ci([c["task"] for c in done]),
                "solved": mean_ci([c["solved"] for c in done]),
            }
        )
    return out


def experiment_record(reader: StoreReader, experiment: dict[str, Any]) -> dict[str, Any]:
    """One experiment: its settings, every cell, and the per-arm summary."""
    cells = experiment_cells(reader, experiment)
    counts: dict[str, int] = {}
    for cell in cells:
        counts[cell["status"]] = counts.get(cell["status"], 0) + 1
    return {
        "id": experiment["id"],
        "name": experiment["name"],
        "status": experiment["status"],
        "arms": experiment["arms"],
        "seeds": experiment["seeds"],
        "steps": experiment["steps"],
        "warmup_steps": experiment["warmup_steps"],
        "created_at": experiment["created_at"],
        "updated_at": experiment["updated_at"],
        "cell_status": counts,
        "cells": cells,
        "summary": arm_summary(experiment["arms"], cells),
    }
