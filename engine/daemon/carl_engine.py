"""`carl engine start|stop|status|run`: the engine daemon from a shell."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from engine.control import engine_report, start_engine, stop_engine
from engine.control.process import _last_start_code, start_failure
from engine.durations import compact_duration
from engine.errors import CliError

CARRY_ON = "a training run is a process of its own: it carries on to its end; s in carl-tui stops it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["start", "stop", "status", "run"])
    parser.add_argument("--json", action="store_true", help="status: print one JSON object")


def run(args: argparse.Namespace, home: Path) -> int:
    if args.action == "run":
        from .loop import run_engine  # the daemon's own loop: the engine's whole import

        return run_engine(home)
    if args.action == "start":
        status, started = start_engine(home)
        if status.state != "up":
            raise CliError(start_failure(home, status, _last_start_code.get(home)))
        if started:
            print(
                f"engine started (pid {status.pid}) in the background; log {status.log_path}; "
                "`carl engine stop` stops it"
            )
        else:
            print(f"engine already running (pid {status.pid}); log {status.log_path}")
        return 0
    if args.action == "stop":
        training = engine_report(home)["training"]
        if not stop_engine(home):
            print("engine was not running")
            return 0
        print("engine stopped")
        if training:  # what it started and leaves running
            runs = ", ".join(f"{r['run'] or r['what']} (pid {r['pid']})" for r in training)
            print(f"still training: {runs} — {CARRY_ON}")
        return 0
    report = engine_report(home)
    if args.json:
        print(json.dumps(report))
    else:
        print("\n".join(engine_lines(report)))
    if report["state"] != "up":
        return 3
    return 4 if report["stalled_s"] is not None else 0


def engine_lines(report: dict[str, Any]) -> list[str]:
    """`carl engine status` for a person: the engine, then what it is running, then how to stop it."""
    if report["state"] != "up":
        why = " (stopped with `carl engine stop`)" if report["stopped_by_user"] else ""
        why += " (stale pidfile recovered)" if report["stale_pidfile_recovered"] else ""
        lines = [
            f"engine down{why}; `carl engine start` starts it",
            f"  home      {report['home']}",
            f"  log       {report['log_path']}",
        ]
        if report["agents"]["wanted"]:
            lines.append("  agents    the plane was up: it comes back up with the engine")
        return lines
    beat = (
        report["heartbeat_at"] and f", heartbeat {compact_duration(time.time() - report['heartbeat_at'])} ago"
    )
    uptime = f", up {compact_duration(report['uptime_s'])}" if report["uptime_s"] is not None else ""
    head = f"engine up (pid {report['pid']}{uptime}{beat or ''})"
    if report["stalled_s"] is not None:
        since = time.strftime("%H:%M:%S", time.localtime(report["heartbeat_at"]))
        head = f"engine stalled since {since} (pid {report['pid']}, no heartbeat for"
        head += f" {compact_duration(report['stalled_s'])}): {report['why']}"
    lines = [
        head,
        f"  home      {report['home']}",
        f"  log       {report['log_path']}",
    ]
    training = report["training"]
    if not training:
        lines.append("  training  nothing (n in carl-tui, `carl demo`, `carl experiment` start runs)")
    for i, run in enumerate(training):
        head = "  training  " if i == 0 else " " * 12
        if run["run"] is None:
            lines.append(f"{head}{run['what']}: starting (pid {run['pid']}; log {run['log']})")
            continue
        step = "-" if run["step"] is None else f"{run['step']:,}"
        total = f"/{run['max_steps']:,}" if run["max_steps"] else ""
        lines.append(f"{head}{run['run']}: {run['state']}, step {step}{total} (pid {run['pid']})")
    for i, ev in enumerate(report["evals"]):
        head = "  evals     " if i == 0 else " " * 12
        lines.append(f"{head}{ev['run']} (pid {ev['pid']}; log {ev['log']})")
    lines.append(f"  agents    {_agents_line(report['agents'])}")
    lines.append(f"`carl engine stop` stops it{' and its agents plane' if report['agents']['up'] else ''}")
    if training:
        lines.append(f"({CARRY_ON})")
    return lines


def _agents_line(agents: dict[str, Any]) -> str:
    if not agents["up"]:
        return "plane not up (`carl agents up` starts one)"
    server = agents["server"] or {}
    if server.get("local"):
        where = f"nats-server {server.get('state') or '?'} at {server.get('url')} (pid {server.get('pid')})"
    else:
        where = f"external NATS at {server.get('url') or '?'}"
    counts: dict[str, int] = {}
    for proc in agents["processes"]:
        if proc["state"] in ("running", "starting", "restarting"):
            counts[proc["role"]] = counts.get(proc["role"], 0) + 1
    parts = [f"{n} {role}{'s' if n != 1 and role == 'worker' else ''}" for role, n in counts.items()]
    return f"plane up: {where}; " + (", ".join(parts) if parts else "no process running")
