"""The plane's processes: a manager, a worker, a trainer, each run by `python -m engine.agents ROLE`.

The engine spawns them with `--settings` (the plane's settings as JSON, written by the engine) and
the plane's address (`--url`, and a token or creds *file*: no secret is ever in argv).
`carl agents worker` runs the same worker by hand, on another machine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import paths
from engine.errors import CarlError
from engine.faults import store_trouble

from .audit import audit_bound, stream_epoch
from .bus import (
    Address,
    connect,
    ensure_stream,
    fetch,
    manager_trainer_subscription,
    resolve_address,
    trainer_subscription,
)
from .bus import close as bus_close
from .events import EventRejected, TrainingRolloutEvent, parse_event
from .plane_settings import AgentsSettings
from .server import AgentsError
from .verdicts import Verdicts
from .weights import models_bucket, publish_update

log = logging.getLogger("carl.agents")


# -- building the parts -----------------------------------------------------------------------


def build_scorer(settings: AgentsSettings, *, api_key: str | None = None, base_url: str | None = None) -> Any:
    """The PRM step scorer with its judge, inside the environment profiles' combined scorer."""
    from .scoring import ClaudeJudge, CombinedScorer, OfflineJudge, OpenAIJudge, PRMScorer

    if settings.judge == "openai":
        if not settings.judge_url or not settings.judge_model:
            raise AgentsError("agents.judge openai needs agents.judge_url and agents.judge_model")
        judge: Any = OpenAIJudge(
            settings.judge_url, settings.judge_model, api_key=os.environ.get("CARL_JUDGE_API_KEY")
        )
    elif settings.judge == "claude":
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise AgentsError("agents.judge claude needs ANTHROPIC_API_KEY")
        judge = ClaudeJudge(key, settings.claude_model, base_url=base_url)
    else:
        judge = OfflineJudge()
    return CombinedScorer(PRMScorer(judge, votes=settings.votes))


def build_feedback(
    settings: AgentsSettings, *, api_key: str | None = None, base_url: str | None = None
) -> Any:
    """Claude writes the manager's feedback when asked for and a key is there; otherwise the offline
    manager."""
    from .feedback import ClaudeFeedback, OfflineFeedback

    key = api_key or os.environ.get("ANTHROPIC_API_KEY")
    if settings.feedback == "claude" and key:
        return ClaudeFeedback(key, settings.claude_model, base_url=base_url)
    if settings.feedback == "claude":
        log.warning("agents: no ANTHROPIC_API_KEY; the manager writes its feedback offline")
    return OfflineFeedback()


def build_hints(
    settings: AgentsSettings, home: Path, *, api_key: str | None = None, base_url: str | None = None
) -> Any:
    """Who writes the hints (engine/agents/hints.py): None with `agents.hints` off; Claude when it writes the
    feedback; the manager's own model when one is configured and Claude is not the manager; else the offline
    hints (also for a Claude manager without a key)."""
    from .hints import ClaudeHints, OfflineHints

    if not settings.hints:
        return None
    key = api_key or os.environ.get("ANTHROPIC_API_KEY")
    if settings.feedback == "claude" and key:
        if settings.manager_model:
            log.warning(
                "agents: Claude writes the hints; agents.manager_model %s is not used", settings.manager_model
            )
        from engine.llm.claude import AsyncAsker

        from .hints import HINT_TOKENS

        return ClaudeHints(AsyncAsker(key, settings.claude_model, base_url, max_tokens=HINT_TOKENS))
    if settings.manager_model and settings.feedback != "claude":  # as AgentsSettings.trains_manager decides
        from .manager_model import ModelHints

        return ModelHints(settings, home, seed=settings.seed)
    return OfflineHints()


def task_specs(tasks: str) -> list[Any]:
    from .tasks import demo_tasks, load_tasks

    return demo_tasks() if tasks == "demo" else load_tasks(Path(tasks).expanduser())


def group_size(settings: AgentsSettings) -> int:
    return settings.train.group_size if settings.train.enabled else 1


# -- the roles ---------------------------------------------------------------------------------


async def run_manager(
    address: Address, settings: AgentsSettings, home: Path, *, tasks: str, limit: int | None, cycle: bool
) -> int:
    from .manager import Manager, TaskFeed

    feed = TaskFeed(task_specs(tasks), limit=limit, cycle=cycle)
    manager = Manager(
        address,
        settings,
        feed,
        build_scorer(settings),
        build_feedback(settings),
        group_size=group_size(settings),
        store_path=paths.db_path(home),
        hints=build_hints(settings, home),
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, manager.stop.set)
    summary = await manager.run()
    log.info("manager: %s", summary.as_dict())
    return 0


async def run_trainer(
    address: Address,
    settings: AgentsSettings,
    home: Path,
    *,
    resume: bool = False,
    run_name: str | None = None,
    manager: bool = False,
) -> int:
    """Train the served model from `training.rollouts`; each new adapter goes out on `model.updates`. With
    `manager`, the manager's own model (agents.manager_model) from `training.manager` instead, its adapters
    out on `model.manager` (engine/agents/manager_model.py), without OPD (a hint has no hint of its own).

    resume: a restarted trainer process carries on its run from the newest checkpoint.
    """
    from engine.store import Store

    from .backends import system_prompt
    from .events import MANAGER_TARGET
    from .trainer import GROUP_TIMEOUT_S, PlaneTrainer

    if manager and not settings.manager_model:
        raise AgentsError("the manager trainer needs agents.manager_model (--manager-model)")
    store = Store(paths.db_path(home))
    trainer = PlaneTrainer(
        settings.train.model_copy(update={"opd": False}) if manager else settings.train,
        model=(settings.manager_model or settings.model) if manager else settings.model,
        home=home,
        store=store,
        run_name=run_name or ("agents-manager" if manager else "agents-train"),
        temperature=settings.temperature,
        group_timeout_s=MANAGER_GROUP_TIMEOUT_S if manager else GROUP_TIMEOUT_S,
        system_prompt=None if manager else system_prompt(settings),
        publish_target=MANAGER_TARGET if manager else None,
        seed=settings.seed,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()  # the groups already in are trained first; then the run stops with a checkpoint

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    status, error = "failed", None
    try:
        await asyncio.to_thread(trainer.prepare, reopen=resume)
        if resume:
            step = await asyncio.to_thread(trainer.resume)
            log.info("trainer: resumed %s at step %d", trainer.run_name, step)
        nc = await connect(address, "carl-trainer", on_event=lambda what: log.info("trainer: %s", what))
        js = nc.jetstream()
        await ensure_stream(js, settings.stream, settings.replicas)
        await models_bucket(js, settings.replicas)  # where each adapter goes, as many copies as the stream
        sub = await (manager_trainer_subscription(js) if manager else trainer_subscription(js))
        receiving = _Receiving(Verdicts(paths.db_path(home), await stream_epoch(js)))
        try:
            await _train_loop(js, sub, trainer, stop, receiving)
        finally:
            receiving.verdicts.close()
        await _train_what_is_ready(js, trainer)
        status = "finished" if trainer.finished else "stopped"
        await bus_close(nc)
    except Exception as exc:
        error = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise
    finally:
        if trainer.pump is not None:
            await asyncio.to_thread(trainer.close, status, error=error)
        store.close()
    return 0


async def _train_what_is_ready(js: Any, trainer: Any) -> None:
    """Asked to stop: train the complete groups already received, then stop with a checkpoint."""
    while not trainer.done and trainer.ready() >= trainer.settings.groups_per_update:
        update = await asyncio.to_thread(trainer.step)
        if update is not None:
            await publish_update(js, update)
    if not trainer.done:
        trainer.pump.request_stop("the plane stopped")
        await asyncio.to_thread(trainer.step)  # applies the stop: the checkpoint is saved


MANAGER_GROUP_TIMEOUT_S = 60.0  # a task group's hints are rarely all judged: train what was, after this
VERDICT_WAIT_S = 30.0  # a rollout the audit has not stored after this long: the trainer says why, waits on


@dataclass
class _Receiving:
    """What the trainer's receiving keeps between two fetches."""

    verdicts: Verdicts
    held: list[Any] = field(default_factory=list)  # rollouts waiting for the audit's verdict, unacknowledged
    held_since: float | None = None  # since when the oldest of them waits
    refused: int = 0
    told: bool = False  # said that the audit is behind (once per wait)


async def _receive(js: Any, sub: Any, trainer: Any, state: _Receiving) -> None:
    """Take the rollouts waiting on the stream (up to 32) that the audit has stored (verdicts.py): those
    it admitted and the trainer can train on are stored (its spool) before any of them is acknowledged,
    so a trainer killed at any moment loses none; those it refused are acknowledged and left out, with
    the audit's reason. A rollout the audit has not stored yet is held, unacknowledged, until it has."""
    msgs = state.held + await fetch(sub, 32, 0.05 if state.held else 0.5)
    verdicts = await asyncio.to_thread(state.verdicts.of, [m.metadata.sequence.stream for m in msgs])
    taken, answered, held = [], [], []
    for msg in msgs:
        try:
            event = parse_event(msg.subject, msg.data)
        except EventRejected:
            await msg.term()  # never redelivered; the audit keeps it, with the reason
            continue
        verdict = verdicts.get(msg.metadata.sequence.stream)
        if verdict is None:
            held.append(msg)
            continue
        answered.append(msg)
        if isinstance(event, TrainingRolloutEvent):
            if verdict.admitted:
                reason = trainer.add(event)
            else:
                reason = f"task {event.task_id}: refused by the audit: {verdict.reason}"
            if reason is None:
                taken.append(event)
                continue
            state.refused += 1
            if state.refused <= 5 or state.refused % 100 == 0:
                log.info("trainer: not training on it: %s (%d refused so far)", reason, state.refused)
    if taken:
        await _stored(trainer, taken)
    for msg in answered:
        await msg.ack()
    await _hold(js, state, held)


async def _hold(js: Any, state: _Receiving, held: list[Any]) -> None:
    """Keep the rollouts the audit has not stored yet; past VERDICT_WAIT_S, say why (once), keep them
    from going back to the stream, and look the stream up again (one made anew has another epoch)."""
    state.held = held
    if not held:
        state.held_since, state.told = None, False
        return
    now = time.monotonic()
    if state.held_since is None:
        state.held_since = now
    if now - state.held_since < VERDICT_WAIT_S:
        return
    if not state.told:
        why = "is behind" if await audit_bound(js) else "is not running (no engine, or its bridge is down)"
        log.warning(
            "trainer: %d rollouts wait for the audit, which %s: the trainer trains only on what it admitted",
            len(held),
            why,
        )
        state.told = True
    state.verdicts.epoch = await stream_epoch(js)
    for msg in held:
        await msg.in_progress()  # the ack wait starts again: not given to the stream again meanwhile
    state.held_since = now


async def _stored(trainer: Any, rollouts: list[TrainingRolloutEvent]) -> None:
    """`trainer.keep(rollouts)`, tried again while the store is in trouble (locked, full): nothing is
    acknowledged meanwhile. Anything else raises, and the unacknowledged rollouts come back to the
    restarted trainer."""
    delay = 0.5
    while True:
        try:
            await asyncio.to_thread(trainer.keep, rollouts)
            return
        except Exception as exc:
            if not store_trouble(exc):
                raise
            log.warning("trainer: cannot store %d rollouts (%s); trying again", len(rollouts), exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


async def _train_loop(js: Any, sub: Any, trainer: Any, stop: asyncio.Event, receiving: _Receiving) -> None:
    while not stop.is_set() and not trainer.done:
        await _receive(js, sub, trainer, receiving)
        # One step when enough groups are ready (commands are applied either way; a paused run waits in it).
        update = await asyncio.to_thread(trainer.step)
        if update is not None:
            await publish_update(js, update)
            log.info("trainer: published %s (step %d)", update.model_version, update.step)


# -- `python -m engine.agents ROLE` --------------------------------------------------------------


def _address(args: argparse.Namespace, settings: AgentsSettings, home: Path) -> Address:
    return resolve_address(
        settings, url=args.url, token_file=args.token_file, creds_file=getattr(args, "creds", None), home=home
    )


def _settings(args: argparse.Namespace) -> AgentsSettings:
    if args.settings:
        try:
            return AgentsSettings.model_validate_json(Path(args.settings).read_text())
        except (OSError, ValueError) as exc:
            raise AgentsError(
                f"{args.settings}: not the plane's settings ({' '.join(str(exc).split())[:200]})"
            ) from None
    return AgentsSettings()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.agents", description="one process of the agents plane"
    )
    parser.add_argument("role", choices=["manager", "worker", "trainer", "manager-trainer"])
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument(
        "--settings", default=None, help="the plane's settings (JSON, as the engine writes them)"
    )
    parser.add_argument("--url", default=None)
    parser.add_argument("--token-file", default=None)
    parser.add_argument("--creds", default=None)
    parser.add_argument("--tls-ca", default=None)
    parser.add_argument("--tasks", default="demo")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--cycle", action="store_true")
    parser.add_argument("--kind", default=None)
    parser.add_argument("--id", default=None)
    parser.add_argument("--command-id", type=int, default=None)
    parser.add_argument("--resume", action="store_true", help="trainer: carry on the run from its checkpoint")
    args = parser.parse_args(argv)
    home = args.home or paths.carl_home()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s [{args.role} %(process)d] %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = _settings(args)
        address = _address(args, settings, home)
        if args.role == "manager":
            return asyncio.run(
                run_manager(address, settings, home, tasks=args.tasks, limit=args.limit, cycle=args.cycle)
            )
        if args.role in ("trainer", "manager-trainer"):
            manager = args.role == "manager-trainer"
            return asyncio.run(run_trainer(address, settings, home, resume=args.resume, manager=manager))
        from .worker import run_worker

        return asyncio.run(
            run_worker(
                address,
                settings,
                kind=args.kind or settings.worker_kind,
                home=home,
                worker_id=args.id,
                command_id=args.command_id,
            )
        )
    except CarlError as exc:
        print(f"carl agents {args.role}: {exc}", file=sys.stderr)
        return 2
