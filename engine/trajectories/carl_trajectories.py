"""`carl trajectories ...`: import, list, status, ablate, export, train, eval;
and `carl hook`, `carl hooks`."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from engine import paths
from engine.errors import CarlError
from engine.files import named, reason
from engine.limits import int_flag
from engine.names import name_arg
from engine.text import visible, visible_line
from engine.trajectories.trajectory_settings import load as load_config


class TrajectoryCliError(CarlError):
    """One line for the user."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    imp = sub.add_parser("import", help="import Claude Code transcripts, Codex rollouts or KARL records")
    imp.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help="files or folders (default: ~/.claude/projects and ~/.codex/sessions)",
    )
    lst = sub.add_parser("list", help="the newest scored trajectories")
    lst.add_argument("--limit", type=int_flag(1), default=20)
    lst.add_argument("--domain", default=None)
    lst.add_argument("--json", action="store_true", help="one JSON object a line")
    sts = sub.add_parser("status", help="counts, domain baselines and retraining triggers")
    sts.add_argument("--json", action="store_true", help="print one JSON object")
    abl = sub.add_parser("ablate", help="leave-one-out ablation of the five reward signals")
    abl.add_argument(
        "--paper",
        type=Path,
        default=None,
        metavar="FILE",
        help="rebuild KARL's published table from a KARL record file's stored signals, "
        "beside the same records re-scored by ours",
    )
    abl.add_argument("--json", action="store_true", help="print one JSON object")
    exp = sub.add_parser("export", help="ChatML SFT data with advantage-tier oversampling")
    exp.add_argument("out", type=Path, help="output folder (train.jsonl, valid.jsonl)")
    exp.add_argument("--min-reward", type=float, default=0.0)
    exp.add_argument("--quality", choices=("high", "medium", "medium+", "low+"), default=None)
    trn = sub.add_parser("train", help="advantage-weighted LoRA SFT of a model on the best trajectories")
    trn.add_argument("--model", default="carl-tiny", help="'carl-tiny', a model directory or a hub id")
    trn.add_argument("--strategy", choices=("advantage", "uniform"), default="advantage")
    trn.add_argument(
        "--size", type=int_flag(1), default=None, help="examples to sample (default: the export's)"
    )
    trn.add_argument("--steps", type=int_flag(1), default=60)
    trn.add_argument("--name", type=name_arg, default=None)
    evl = sub.add_parser("eval", help="compare an adapter's tool plans with the plans that scored high")
    evl.add_argument("adapter", type=Path, help="the adapter directory (a run's final/)")
    evl.add_argument("--uniform", type=Path, default=None, help="an adapter trained on a uniform sample")
    evl.add_argument("--limit", type=int_flag(1), default=None)
    evl.add_argument("--no-base", action="store_true", help="skip the base-model comparison")


def run(args: argparse.Namespace, home: Path) -> int:
    handler = {
        "import": _import,
        "list": _list,
        "status": _status,
        "ablate": _ablate,
        "export": _export,
        "train": _train,
        "eval": _eval,
    }[args.action]
    return handler(args, home)


def add_hook_arguments(parser: argparse.ArgumentParser) -> None:
    """`carl hook` takes no arguments: the payload comes on stdin."""
    parser.description = (
        "Record one Claude Code hook payload, read from stdin, into the spool of $CARL_HOME (or --home). "
        "This is what the hooks `carl hooks install` writes into settings.json run for every event; it "
        "prints nothing and always exits 0, so a hook can never disturb Claude Code. The engine reads the "
        "spool and assembles the payloads into scored trajectories."
    )


def run_hook(args: argparse.Namespace, home: Path) -> int:
    from engine.trajectories.capture.recorder import main as record_hook

    return record_hook([])  # the home reaches the recorder as $CARL_HOME, which the dispatch set


def add_hooks_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "rest", nargs=argparse.REMAINDER, help="install|uninstall|status [--user|--project|--local]"
    )


def run_hooks(args: argparse.Namespace, home: Path | None) -> int:
    from engine.trajectories.capture.hooks import hooks_cli_main

    return hooks_cli_main(args.rest)


def _store(home: Path) -> Any:
    from engine.store import Store  # the writer (sqlite-utils) only when a command needs it

    return Store(paths.db_path(home))


def default_sources() -> list[Path]:
    found = [Path.home() / ".claude" / "projects", Path.home() / ".codex" / "sessions"]
    return [p for p in found if p.exists()]


def _import(args: argparse.Namespace, home: Path) -> int:
    from engine.trajectories.capture.live import refresh_plasticity
    from engine.trajectories.importers.trace_files import import_paths
    from engine.trajectories.store import save

    sources = args.paths or default_sources()
    if not sources:
        raise TrajectoryCliError(
            "nothing to import: give paths (no ~/.claude/projects or ~/.codex/sessions here)"
        )
    for source in sources:
        try:
            os.stat(source)
        except FileNotFoundError:
            raise TrajectoryCliError(f"{named(source)}: no such file or folder") from None
        except OSError as exc:  # a symbolic link loop, a folder closed to us
            raise TrajectoryCliError(f"{named(source)}: {reason(exc)}") from None
    config = load_config(home)
    started = time.monotonic()
    result = import_paths(sources, detector=config.detector)
    with _store(home) as store:
        saved = save(store, result.trajectories, table=config.table)
        if saved.stored:
            refresh_plasticity(store)
    print(
        f"{result.files} files, {result.sessions} sessions ({result.empty_sessions} empty, ignored): "
        f"{len(result.trajectories)} trajectories — {saved.new} new, {saved.updated} updated, "
        f"{saved.unchanged} unchanged ({time.monotonic() - started:.1f}s)"
    )
    if result.skipped:
        print(f"skipped {len(result.skipped)} malformed line(s) or file(s):")
        for line in result.skipped[:10]:  # a skipped line names a file: its name is not trusted
            print(f"  {visible_line(line)}")
        if len(result.skipped) > 10:
            print(f"  … and {len(result.skipped) - 10} more")
    if not result.trajectories and result.skipped:  # something was there, and none of it could be used
        raise TrajectoryCliError(f"nothing imported: {len(result.skipped)} file(s) or line(s) skipped")
    return 0


def _list(args: argparse.Namespace, home: Path) -> int:
    from engine.store import trajectories as trajectory_rows

    with _store(home) as store:
        rows = trajectory_rows.newest(store, args.limit, args.domain)
    if args.json:  # newest first, as the table
        names = ("id", "session_id", "agent", "domain", "tool_count", "success_rate", "reward", "advantage")
        for r in rows:
            print(json.dumps({**dict(zip(names, r[:8], strict=True)), "holdout": bool(r[8]), "prompt": r[9]}))
        return 0
    if not rows:
        print("no trajectories yet: `carl hooks install`, or `carl trajectories import`")
        return 0
    print(
        f"{'id':>6} {'session':<9} {'agent':<12} {'domain':<14} {'tools':>5} {'ok':>5} {'reward':>7} "
        f"{'adv':>7}  prompt"
    )
    for r in rows:
        ok = "—" if r[5] is None else f"{r[5]:.0%}"
        hold = "h" if r[8] else " "
        # Cut after the control characters are written out, so a column keeps its width.
        session, agent, domain = (visible_line(r[i]) for i in (1, 2, 3))
        prompt = visible(" ".join((r[9] or "").split()))[:50]
        print(
            f"{r[0]:>6} {session[:8]:<9} {agent[:12]:<12} {domain[:14]:<14} {r[4]:>5} {ok:>5} {r[6]:>7.3f} "
            f"{r[7]:>+7.2f}{hold} {prompt}"
        )
    return 0


def _status(args: argparse.Namespace, home: Path) -> int:
    from engine.store import trajectories as trajectory_rows
    from engine.trajectories.capture.live import refresh_plasticity

    with _store(home) as store:
        total, holdout = trajectory_rows.count_with_holdout(store)
        domains = trajectory_rows.domains(store)
        waiting = trajectory_rows.hook_payload_count(store)
        plasticity = refresh_plasticity(store) if total else {"triggers": []}
    if args.json:
        print(
            json.dumps(
                {
                    "trajectories": total,
                    "holdout": holdout,
                    "hook_payloads": waiting,
                    "domains": [
                        dict(zip(("domain", "n", "mean", "baseline", "sigma"), d, strict=True))
                        for d in domains
                    ],
                    "triggers": plasticity.get("triggers") or [],
                }
            )
        )
        return 0
    print(f"{total} trajectories ({holdout} held out for evaluation), {waiting} hook payloads recorded")
    if domains:
        print(f"{'domain':<16} {'n':>6} {'mean':>7} {'baseline':>9} {'sigma':>7}")
        for d in domains:
            print(f"{visible_line(d[0]):<16} {d[1]:>6} {d[2]:>7.3f} {d[3]:>9.3f} {d[4]:>7.3f}")
    triggers = plasticity.get("triggers") or []
    print("retraining triggers: " + ("none fired" if not triggers else ""))
    for t in triggers:
        print(f"  ⚑ {visible_line(t['kind'])}: {visible_line(t['detail'])}")
    return 0


def _ablate(args: argparse.Namespace, home: Path) -> int:
    import numpy as np

    from engine.store import trajectories as trajectory_rows
    from engine.trajectories.ablation.leave_one_out import ablate, format_table

    if args.paper is not None:
        return _ablate_paper(args.paper, args.json)
    with _store(home) as store:
        rows = trajectory_rows.signals(store)
    if len(rows) < 21:
        raise TrajectoryCliError(
            f"ablation needs more than 20 scored trajectories (the store has {len(rows)})"
        )
    names = ("outcome", "process", "efficiency", "verification", "consistency")
    matrix = np.array([[json.loads(r or "{}").get(n, 0.0) for n in names] for r in rows], dtype=np.float64)
    table = ablate(matrix)
    if args.json:
        print(json.dumps({"trajectories": len(rows), "rows": [vars(r) for r in table]}))
    else:
        print(format_table(table))
    return 0


def _ablate_paper(path: Path, as_json: bool) -> int:
    from engine.trajectories.ablation.karl import format_paper_ablation, paper_ablation

    result = paper_ablation(path)
    print(json.dumps(result.to_json()) if as_json else format_paper_ablation(result))
    return 0


def _export(args: argparse.Namespace, home: Path) -> int:
    from engine.trajectories.training.export import export_sft, format_export
    from engine.trajectories.training.flowrl_sampler import load_records

    with _store(home) as store:
        records = load_records(store, include_holdout=True)  # the export drops them itself, and counts them
    result = export_sft(records, args.out, min_reward=args.min_reward, quality=args.quality)
    print(format_export(result))
    return 0


def _train(args: argparse.Namespace, home: Path) -> int:
    from engine.trajectories.training.train import format_train, train_adapter

    result = train_adapter(
        home, strategy=args.strategy, size=args.size, model=args.model, steps=args.steps, name=args.name
    )
    print(format_train(result))
    return 0 if getattr(result, "ok", True) else 1


def _eval(args: argparse.Namespace, home: Path) -> int:
    from engine.trajectories.training.plan_eval import evaluate_adapter, format_report

    if not args.adapter.exists():
        raise TrajectoryCliError(f"{args.adapter}: no such adapter directory")
    result = evaluate_adapter(
        home, args.adapter, compare_base=not args.no_base, compare_uniform=args.uniform, limit=args.limit
    )
    print(format_report(result))
    return 0
