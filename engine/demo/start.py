"""Starting the built-in demo through the engine: what `carl demo` and `carl-tui --demo` share."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from engine import paths
from engine.errors import CliError
from engine.store import run_lookup
from engine.store.commands import Verb

if TYPE_CHECKING:
    from engine.store import Store

# A task a second: light beside training. The workers serve the demo run itself (each checkpoint it
# saves, then its final model), asked the way the run was trained: with no system prompt.
DEMO_PLANE = {
    "workers": 2,
    "tasks": "demo",
    "overrides": {"rate": 1.0, "system_prompt": ""},
}


def start_demo(
    home: Path, steps: int | None, backend: str | None = None, *, stay: bool = False, engine: bool = True
) -> str | None:
    """Have the engine start the built-in demo (SFT warm-up, then GRPO with the reward cascade
    on the tiny model) unless a demo run is already live; the control room then watches it. The
    demo's agents plane stops when the demo run ends, unless `stay`. Returns the name the queued run
    will have (None: one was live already). `engine=False`: the caller starts the engine (the control
    room does, after its first frame, which then shows the demo on its way rather than a blank terminal)."""
    if any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "transformers")):
        raise CliError("the demo trains a model: install the train extra (pip install 'carl-tui[train]')")
    if backend == "mlx" and any(importlib.util.find_spec(m) is None for m in ("mlx", "mlx_lm")):
        raise CliError("--backend mlx: install the mlx extra (pip install 'carl-tui[mlx]')")
    from engine.control import ensure_engine
    from engine.store import Store

    if engine:
        ensure_engine(home)  # says so on stderr when it starts one: the engine outlives this command
    with Store(paths.db_path(home)) as store:
        live = run_lookup.live_demo_run(store)
        if live is not None:
            print(f"demo run {live!r} is live; opening the control room on it")
            return None
        name = free_run_name(store, "demo")  # the name the run will have: the plane is bound to it
        args = {
            "config": "demo",
            "name": name,
            **({"max_steps": steps} if steps else {}),
            **({"backend": backend} if backend else {}),
        }
        store.enqueue_command(Verb.TRAIN, args, target="engine", origin="cli")
        plane = queue_demo_plane(store, None if stay else name, serve_run=name)
    logs = paths.shown(paths.logs_dir(home) / "train-*.log")
    print(f"demo training queued: the engine starts it (logs in {logs})")
    if plane:
        print(plane)
    return name


def free_run_name(store: Store, name: str) -> str:
    """`name`, or the first of name-2, name-3, ... that no run has: the name the store gives a new run."""
    taken = set(run_lookup.names(store).values())
    unique, n = name, 1
    while unique in taken:
        n += 1
        unique = f"{name}-{n}"
    return unique


def queue_demo_plane(store: Store, until_run: str | None, *, serve_run: str | None = None) -> str | None:
    """A small agents plane on the demo task beside the demo run, so the Agents pane is live too
    (only with the nats extra, and only when no plane is up). Its workers serve `serve_run` (the demo
    run) as it trains: each checkpoint it saves, then its final model. Bound to the run (`until_run`),
    it stops when the run ends; without, it stays up until `carl agents down`."""
    if any(importlib.util.find_spec(m) is None for m in ("nats", "yaml")):
        return "(the Agents pane stays empty: install the nats extra for a live agents plane)"
    plane = store.kv("agents.plane")
    if plane is not None and plane.get("wanted"):
        return None
    spec = {
        **DEMO_PLANE,
        **({"until_run": until_run} if until_run else {}),
        **({"serve_run": serve_run} if serve_run else {}),
    }
    store.enqueue_command(Verb.AGENTS_UP, spec, target="engine", origin="cli")
    serving = f", serving run {serve_run!r} at each checkpoint" if serve_run else ""
    lifetime = (
        f"it stops when run {until_run!r} ends (carl demo --stay, carl-tui --demo-stay keep it up)"
        if until_run
        else "it stays up after the run: carl agents down stops it"
    )
    return f"agents plane queued: a manager and 2 workers on the demo task{serving}; {lifetime}"
