"""The engine daemon: one detached process per $CARL_HOME that follows sources and runs
engine commands from the store's queue.

`start_engine`, `stop_engine`, `engine_status` and `engine_report` are for other processes (the TUI,
the CLI); `ensure_engine` is `start_engine` for a headless command, which says when it started one;
`run_engine` is the daemon's own foreground loop (`carl engine run`, `python -m engine.daemon run`).
"""

from typing import TYPE_CHECKING, Any

from .control import (
    EngineError,
    EngineStatus,
    engine_report,
    engine_status,
    ensure_engine,
    start_engine,
    started_line,
    stop_engine,
)

if TYPE_CHECKING:
    from .loop import ROW_HOOKS, RowHook, on_run_rows, run_engine

__all__ = [
    "ROW_HOOKS",
    "EngineError",
    "EngineStatus",
    "RowHook",
    "engine_report",
    "engine_status",
    "ensure_engine",
    "on_run_rows",
    "run_engine",
    "start_engine",
    "started_line",
    "stop_engine",
]


def __getattr__(name: str) -> Any:
    # The loop pulls in the writer side of the store (sqlite-utils, and with it pandas); the
    # control room only asks for status, so it is imported on first use.
    if name in ("ROW_HOOKS", "RowHook", "on_run_rows", "run_engine"):
        from . import loop

        return getattr(loop, name)
    raise AttributeError(name)
