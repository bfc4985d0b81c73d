"""`carl node`: join this machine to an engine's store as a node (`--join URL`), or list the nodes a store
holds (`--list`). docs/guide/nodes.md is the user's page."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

from engine import paths
from engine.errors import CliError
from engine.names import name_arg

from .wire import default_node_name, node_name_problem

MIN_INTERVAL_S = 0.1  # as the engine's own sampling ([system] interval_s)
MAX_INTERVAL_S = 3600.0
MAX_LOGS = 16  # as many consoles as the engine keeps of a node (wire.MAX_CONSOLES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--join",
        metavar="URL",
        help="nats:// URL of the server the engine reads nodes from (a comma-separated list: a cluster)",
    )
    parser.add_argument(
        "--name",
        type=_node_name,
        default=None,
        help="this node's name (default: the host name up to its first dot)",
    )
    parser.add_argument("--token-file", default=None, help="file holding the server's token")
    parser.add_argument("--creds", default=None, help="NATS .creds file")
    parser.add_argument("--tls-ca", default=None, help="CA certificate of a tls:// server")
    parser.add_argument(
        "--interval", type=_seconds, default=2.0, help="seconds between samples (0.1 to 3600; default 2)"
    )
    parser.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="PATH",
        help="a console file to follow (repeat for more)",
    )
    parser.add_argument(
        "--run",
        type=name_arg,
        default=None,
        metavar="NAME",
        help="the run these consoles belong to (its name)",
    )
    parser.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory whose disk's free space is sampled too (repeat for more)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="the nodes this home's store holds, and what nodes sent that was rejected",
    )
    parser.add_argument("--json", action="store_true", help="with --list: one JSON object")


def _node_name(text: str) -> str:
    problem = node_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
    if not math.isfinite(value) or not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"expected seconds from {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g}")
    return value


def run(args: argparse.Namespace, home: Path) -> int:
    if args.list:
        return _list(home, as_json=args.json)
    if not args.join:
        raise CliError("node: give --join URL (the NATS server to publish to), or --list")
    from .publisher import NodeOptions, NodeProcess

    options = NodeOptions(
        url=_url(args.join),
        name=args.name or default_node_name(),
        home=home,
        interval_s=args.interval,
        token_file=_file(args.token_file, "--token-file"),
        creds_file=_file(args.creds, "--creds"),
        tls_ca_file=_file(args.tls_ca, "--tls-ca"),
        logs=_logs(args.log),
        run=args.run,
        watch=[str(Path(d).expanduser().resolve()) for d in args.watch],
    )
    if options.token_file:
        from engine.agents.server import read_token

        read_token(options.token_file)  # an unreadable or empty token file: one line now, not at connect
    return asyncio.run(NodeProcess(options).run())


def _url(url: str) -> str:
    from engine.agents.plane_settings import check_url

    try:
        return check_url(url)
    except ValueError as exc:
        raise CliError(f"--join: {exc}") from None


def _file(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    from engine.files import FileKindError, regular_file

    resolved = Path(path).expanduser().resolve()
    try:
        regular_file(resolved)
    except FileKindError as exc:
        raise CliError(f"{flag}: {exc}") from None
    return str(resolved)


def _logs(given: list[str]) -> list[Path]:
    """The --log paths, absolute; one that exists must be a regular file (one that does not is waited for)."""
    import os
    import stat

    from engine.files import kind_of

    if len(given) > MAX_LOGS:
        raise CliError(f"--log: {len(given)} files; a node follows at most {MAX_LOGS}")
    out: list[Path] = []
    for text in given:
        path = Path(text).expanduser().absolute()
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise CliError(f"--log {path}: {exc.strerror}") from None
        if mode is not None and not stat.S_ISREG(mode):
            raise CliError(f"--log {path}: {kind_of(mode)}, not a log file")
        if path not in out:
            out.append(path)
    return out


# -- --list ------------------------------------------------------------------------------------------------


def _list(home: Path, *, as_json: bool) -> int:
    from engine.store import StoreReader

    db = paths.db_path(home)
    if not db.exists():
        raise CliError(f"{home}: no store here (no engine has run with this home)")
    reader = StoreReader(db)
    try:
        nodes = reader.system.nodes()
        consoles = reader.system.node_consoles()
        rejected = reader.system.node_rejected(10)
        reading = reader.kv("nodes.consumer") or {}
    finally:
        reader.close()
    if as_json:
        print(json.dumps({"reading": reading, "nodes": nodes, "consoles": consoles, "rejected": rejected}))
        return 0
    print(_reading(reading))
    now = time.time()
    for node in nodes:
        ago = _ago(now - node["last_seen"]) if node["last_seen"] else "never"
        note = f"  {node['note']}" if node["note"] else ""
        print(f"{node['name']:<24} {node['via']:<5} {node['state']:<8} last heard {ago}{note}")
        for console in (c for c in consoles if c["node_id"] == node["id"]):
            print(f"    console {console['name']}: {console['lines']:,} lines in {console['path']}")
    if rejected:
        print("rejected, newest first:")
        for row in rejected:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["received_at"]))
            print(f"  {stamp}  {row['node'] or '?'}  {row['subject']}: {row['reason']}")
    return 0


def _reading(state: dict[str, Any]) -> str:
    if not state or state.get("state") == "off":
        return "the engine reads no nodes (no [nodes] url in engine.toml, and the agents plane is down)"
    line = f"the engine reads nodes from {state.get('url')}: {state.get('state')}"
    for key in ("error", "trouble"):
        if state.get(key):
            line += f" ({state[key]})"
    return line


def _ago(seconds: float) -> str:
    from engine.durations import compact_duration

    return f"{compact_duration(max(seconds, 0.0))} ago"
