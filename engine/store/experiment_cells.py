"""What an experiment's runner reads of carl.db about a cell's run (engine/experiments/experiment_runner.py):
the engine's answer to the command that starts it, and, once the run is evaluated, the figures its cell keeps.

Reads on the writer's connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .db import Store


class CellFigures(NamedTuple):
    """What a finished cell keeps of its run: its newest eval, the step its gate first opened, its last Φ."""

    eval_id: int | None
    gate_step: int | None  # None: the gate never opened, or the arm has no gate
    final_phi: float | None


def command_outcome(store: Store, command_id: int) -> tuple[str, str | None]:
    """(state, result) of a command."""
    state, result = store.conn.execute(
        "SELECT state, result FROM commands WHERE id=?", (command_id,)
    ).fetchone()
    return state, result


def cell_figures(store: Store, run_id: int, *, gated: bool) -> CellFigures:
    """The run's newest eval, the first step its gate was not closed (read only when `gated`: a task-only run
    keeps a gate too, but it gates nothing) and its last step's mean Φ."""
    eval_id = store.conn.execute("SELECT max(id) FROM evals WHERE run_id=?", (run_id,)).fetchone()[0]
    gate = None
    if gated:
        gate = store.conn.execute(
            "SELECT min(step) FROM gate_states WHERE run_id=? AND state!='closed'", (run_id,)
        ).fetchone()[0]
    phi = store.conn.execute(
        "SELECT phi_mean FROM phi_stats WHERE run_id=? ORDER BY step DESC LIMIT 1", (run_id,)
    ).fetchone()
    return CellFigures(eval_id, gate, phi[0] if phi else None)
