"""The engine process seen from outside: start it, stop it, ask how it is (process.py), through its pidfile
(pidfile.py). The TUI and every headless command use this; the daemon itself is engine.daemon."""

from .process import (
    EngineError,
    EngineStatus,
    engine_report,
    engine_status,
    ensure_engine,
    start_engine,
    started_line,
    stop_engine,
)

__all__ = [
    "EngineError",
    "EngineStatus",
    "engine_report",
    "engine_status",
    "ensure_engine",
    "start_engine",
    "started_line",
    "stop_engine",
]
