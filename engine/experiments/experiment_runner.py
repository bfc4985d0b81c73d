"""Run an experiment: every arm-seed cell as a real training run started by the engine, then evaluated.

Cells run one at a time (a 2-core box trains one model at a time well), seeds outermost, so the first
complete seeds come early. Each cell's run is started through the engine's command queue, exactly
as the control room starts a run, and followed through the store; its held-out eval is run here once
the run has ended. Everything is stored as it happens: running the same experiment again skips the
finished cells, adopts a cell whose run is still going (left by an interrupted `carl experiment`),
and runs the rest anew.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import paths
from engine.store import Store, experiment_cells, run_lookup
from engine.store.commands import Verb
from engine.training.artifacts import process_alive
from engine.training.config import ConfigError, TrainConfig, config_from_data

from .arms import GATED_ARMS, GRPO_ARMS, ExperimentError, cell_config, check_base

POLL_S = 0.5  # how often the store is read while a cell's run trains
START_TIMEOUT_S = 300.0  # the engine must have started the run by then


@dataclass(frozen=True)
class Experiment:
    id: int
    name: str
    base: TrainConfig
    arms: list[str]
    seeds: list[int]
    steps: int


def open_experiment(
    store: Store, name: str, base: TrainConfig, arms: list[str], seeds: list[int], steps: int, source: str
) -> Experiment:
    """The stored experiment `name`, created if new. An existing one must have been asked the same,
    but for more seeds or more arms, which add their cells to it."""
    check_base(base, arms, source)
    wanted: dict[str, Any] = {"config": base.model_dump(), "arms": arms, "seeds": seeds, "steps": steps}
    found = store.experiment(name)
    if found is None:
        experiment_id = store.create_experiment(
            name, wanted["config"], arms, seeds, steps, base.sft_warmup_steps
        )
        return Experiment(experiment_id, name, base, arms, seeds, steps)
    for key, value in wanted.items():
        # More seeds or more arms extend the experiment: its finished cells stay and count.
        grows = key in ("arms", "seeds") and set(found[key]) <= set(value)
        if found[key] != value and not grows:
            what = "config" if key == "config" else f"--{key}"
            raise ExperimentError(
                f"experiment {name!r} exists with another {what}; run it as it was, with more seeds or arms,"
                " or pick another --name"
            )
    arms = [*found["arms"], *(a for a in arms if a not in found["arms"])]
    seeds = [*found["seeds"], *(s for s in seeds if s not in found["seeds"])]
    if (arms, seeds) != (found["arms"], found["seeds"]):
        store.extend_experiment(found["id"], arms, seeds)
    return Experiment(found["id"], name, base, arms, seeds, steps)


def stored_experiment(store: Store, name: str) -> Experiment:
    found = store.experiment(name)
    if found is None:
        known = ", ".join(e["name"] for e in store.experiments()) or "none yet"
        raise ExperimentError(f"no experiment {name!r} (experiments: {known})")
    try:
        base = config_from_data(found["config"], f"experiment {name}")
    except ConfigError as exc:
        raise ExperimentError(str(exc)) from None
    return Experiment(found["id"], name, base, found["arms"], found["seeds"], found["steps"])


class Runner:
    def __init__(self, store: Store, home: Path, experiment: Experiment, say: Callable[[str], None]) -> None:
        self.store, self.home, self.exp, self.say = store, home, experiment, say
        self.dir = (home or paths.carl_home()) / "experiments" / experiment.name

    def run(self) -> str:
        """Every cell that has not finished; returns the experiment's status (finished or partial)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for seed in self.exp.seeds:
            start_model: str | None = None
            if self.exp.base.sft_warmup_steps:
                warm = self.cell("sft-only", seed, None)
                if warm["status"] != "finished":
                    for arm in self.grpo_arms():
                        self.update(
                            arm,
                            seed,
                            status="failed",
                            error=f"the warm-up of seed {seed} did not finish ({warm['status']})",
                        )
                    continue
                start_model = str(Path(self.run_row(warm["run_id"])["output_dir"]) / "final")
            for arm in self.grpo_arms():
                self.cell(arm, seed, start_model)
        cells = self.store.experiment_runs(self.exp.id)
        status = "finished" if all(c["status"] == "finished" for c in cells) else "partial"
        self.store.update_experiment(self.exp.id, status=status)
        return status

    def grpo_arms(self) -> list[str]:
        return [arm for arm in self.exp.arms if arm in GRPO_ARMS]

    # -- one cell ----------------------------------------------------------------------------------

    def cell(self, arm: str, seed: int, start_model: str | None) -> dict[str, Any]:
        row = self.cell_row(arm, seed)
        if row["status"] == "finished":
            return row
        run = self.run_row(row["run_id"]) if row["run_id"] else None
        if run is not None and row["status"] == "running" and run["status"] == "finished":
            self.say(f"{arm} s{seed}: run {run['name']!r} finished meanwhile")  # its eval had not been run
        elif run is not None and run["status"] in ("running", "paused") and process_alive(run["pid"]):
            self.say(f"{arm} s{seed}: following run {run['name']!r}, still training")
        else:
            run = self.start(arm, seed, start_model)
            if run is None:
                return self.cell_row(arm, seed)
        status, error = self.follow(run["id"])
        if status != "finished":
            self.say(f"{arm} s{seed}: run {run['name']!r} {status}" + (f": {error}" if error else ""))
            self.update(arm, seed, status=status, error=error)
            return self.cell_row(arm, seed)
        self.evaluate(arm, seed, run["id"])
        return self.cell_row(arm, seed)

    def start(self, arm: str, seed: int, start_model: str | None) -> dict[str, Any] | None:
        """Have the engine start this cell's run; the run's row, or None when it never started."""
        name = self.free_name(f"{self.exp.name}-{arm}-s{seed}")
        config_path = self.dir / f"{name}.json"
        config_path.write_text(json.dumps(cell_config(self.exp.base, arm, seed, self.exp.steps, start_model)))
        command = self.store.enqueue_command(
            Verb.TRAIN, {"config": str(config_path), "name": name}, target="engine", origin="experiment"
        )
        self.update(
            arm,
            seed,
            status="running",
            error=None,
            run_id=None,
            eval_id=None,
            task=None,
            solved=None,
            gate_step=None,
            final_phi=None,
        )
        self.say(f"{arm} s{seed}: run {name!r} queued")
        deadline = time.monotonic() + START_TIMEOUT_S
        while (run_id := self.store.run_id_by_name(name)) is None:
            state, result = experiment_cells.command_outcome(self.store, command)
            if state == "failed" or time.monotonic() > deadline:
                error = (
                    result
                    if state == "failed"
                    else "the engine did not start the run (is it up? carl engine status)"
                )
                self.update(arm, seed, status="failed", error=error)
                self.say(f"{arm} s{seed}: {error}")
                return None
            time.sleep(POLL_S)
        self.update(arm, seed, run_id=run_id)
        return self.run_row(run_id)

    def follow(self, run_id: int) -> tuple[str, str | None]:
        """Wait for the run to end: finished, failed or stopped; crashed when its process died mid-run."""
        while True:
            run = self.run_row(run_id)
            if run["status"] in ("finished", "failed", "stopped"):
                return run["status"], run["error"]
            if run["pid"] and not process_alive(run["pid"]):
                run = self.run_row(run_id)  # it may have written its last status just before it exited
                if run["status"] in ("running", "paused"):
                    return "crashed", f"the run's process ({run['pid']}) died at step {run['last_step'] or 0}"
                continue
            time.sleep(POLL_S)

    def evaluate(self, arm: str, seed: int, run_id: int) -> None:
        from engine.training.backend import BadInput
        from engine.training.evaluate import evaluate_run

        try:
            result = evaluate_run(self.store, str(run_id), home=self.home)
        except BadInput as exc:
            self.update(arm, seed, status="failed", error=f"eval: {exc}")
            self.say(f"{arm} s{seed}: eval failed: {exc}")
            return
        figures = experiment_cells.cell_figures(self.store, run_id, gated=arm in GATED_ARMS)
        m = result.metrics
        self.update(
            arm,
            seed,
            status="finished",
            error=None,
            eval_id=figures.eval_id,
            task=m.get("task"),
            solved=m.get("solved"),
            gate_step=figures.gate_step,
            final_phi=figures.final_phi,
        )
        self.say(f"{arm} s{seed}: held-out task {m.get('task')}, solved {m.get('solved')}")

    # -- the store ---------------------------------------------------------------------------------

    def cell_row(self, arm: str, seed: int) -> dict[str, Any]:
        return next(
            c for c in self.store.experiment_runs(self.exp.id) if c["arm"] == arm and c["seed"] == seed
        )

    def update(self, arm: str, seed: int, **fields: Any) -> None:
        self.store.update_experiment_run(self.exp.id, arm, seed, **fields)

    def run_row(self, run_id: int) -> dict[str, Any]:
        run = self.store.run(run_id)
        if run is None:
            raise ExperimentError(f"run {run_id} of experiment {self.exp.name!r} is gone from the store")
        return run

    def free_name(self, name: str) -> str:
        taken = run_lookup.names_like(self.store, name)
        if name not in taken:
            return name
        return next(f"{name}-r{i}" for i in range(2, 10_000) if f"{name}-r{i}" not in taken)
