"""The engine's alert job: a run turning red, or an agents alarm,
becomes an alert to the user's webhook or command.

Each engine tick hands it the health of the runs just analysed (`runs_judged`) and calls `tick`, which reloads
`engine.toml` when it changed, picks up new agents alarms from the store, reads back the outcomes of the tries
the sender thread made, and hands it the tries now due. Everything it writes is kv (outbox.py). It does
nothing while no target is configured; when one first is, alarms from before are not sent (the cursor starts
at the newest), and runs red at that moment are.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.coherence.health import Health
from engine.redact import redact
from engine.store import Store, agent_alarms
from engine.tomlfile import FileWatch

from . import outbox
from .alert_settings import FILE_NAME, AlertSettings, load_settings
from .deliver import Delivery, Sender
from .outbox import Due

CONFIG_CHECK_S = 2.0  # how often engine.toml's modification time is looked at
ALARM_CURSOR = "alerts.agents_cursor"  # the newest agents alarm already looked at
ALARMS_READ = 100  # new alarms read per tick at most

log = logging.getLogger("carl.engine.alerts")


def _clean(value: Any) -> Any:
    """Secrets out of every text of a payload, at every depth."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _stamp(now: float) -> dict[str, Any]:
    return {
        "time": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        "timestamp": round(now, 3),
    }


class Alerts:
    def __init__(self, store: Store, home: Path) -> None:
        self.store = store
        self.home = home
        self.host = socket.gethostname()
        self.settings = AlertSettings()
        self.config = FileWatch(home / FILE_NAME, CONFIG_CHECK_S)  # engine.toml, read again when it changes
        self.dues: list[Due] | None = None  # pending tries, read from the store on the first tick
        self.in_flight: set[tuple[str, str]] = set()
        self.sender: Sender | None = None

    # -- what the engine calls ---------------------------------------------------------------------

    def runs_judged(self, judged: dict[int, Health]) -> None:
        """An alert for each cause of these runs not alerted on before: every red flag, and every flag of the
        box (a rank gone, a disk filling: engine/coherence/health.py BOX_CAUSES)."""
        if not self._ready():
            return
        for run_id, health in judged.items():
            for cause, flag in health.alerting().items():
                key = outbox.run_key(run_id, cause)
                if not outbox.known(self.store, key):
                    self._raise(key, self._run_payload(run_id, cause, flag.reason, flag.level))

    def tick(self) -> None:
        if not self._ready():
            return
        self._new_alarms()
        self._collect()
        self._send_due()

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()

    # -- configuration -------------------------------------------------------------------------------

    def _ready(self) -> bool:
        """The settings current and the pending tries read: whether any target is configured."""
        self._reload()
        if self.dues is None:
            self.dues = outbox.pending(self.store)
        return bool(self.settings.targets)

    def _reload(self) -> None:
        if not self.config.changed():
            return
        self.settings, problems = load_settings(self.home)
        for line in problems:
            log.warning("%s", line)
        if self.settings.targets:
            log.info("alerts go to the %s", " and the ".join(self.settings.targets))

    # -- new alerts -----------------------------------------------------------------------------------

    def _run_payload(self, run_id: int, cause: str, reason: str, level: str = "red") -> dict[str, Any]:
        row = self.store.run(run_id) or {}
        name, step = row.get("name") or f"#{run_id}", row.get("last_step")
        now = time.time()
        return {
            "source": "carl",
            "kind": "run",
            "run": name,
            "run_id": run_id,
            "step": step,
            "cause": cause,
            "reason": reason,
            "level": level,
            **_stamp(now),
            "host": self.host,
            "summary": f"carl: run {name!r} turned {level} at step {step}: {reason}",
        }

    def _new_alarms(self) -> None:
        cursor = self.store.kv(ALARM_CURSOR)
        if cursor is None:  # alerts just configured: from the newest alarm on, not the history
            self.store.set_kv(ALARM_CURSOR, agent_alarms.newest_event_id(self.store))
            return
        rows = agent_alarms.alarms_after(self.store, int(cursor), ALARMS_READ)
        for _, text, worker, task in rows:
            try:
                body = json.loads(text or "{}")
            except ValueError:
                body = {}
            kind = str(body.get("kind") or "alarm")
            key = outbox.alarm_key(kind, worker)
            if not outbox.known(self.store, key):
                self._raise(key, self._alarm_payload(kind, str(body.get("reason") or ""), worker, task))
        if rows:
            self.store.set_kv(ALARM_CURSOR, int(rows[-1][0]))

    def _alarm_payload(self, kind: str, reason: str, worker: str | None, task: str | None) -> dict[str, Any]:
        where = f" on worker {worker}" if worker else ""
        return {
            "source": "carl",
            "kind": "agents",
            "run": None,
            "worker": worker,
            "task": task,
            "cause": kind,
            "reason": reason,
            "level": "alarm",
            **_stamp(time.time()),
            "host": self.host,
            "summary": f"carl: agents alarm ({kind}){where}: {reason}",
        }

    def _raise(self, key: str, payload: dict[str, Any]) -> None:
        payload = _clean(payload)
        assert self.dues is not None
        self.dues += outbox.add(self.store, key, payload, self.settings.targets)
        log.info("alert: %s", payload["summary"])

    # -- delivery -------------------------------------------------------------------------------------

    def _collect(self) -> None:
        if self.sender is None or self.dues is None:
            return
        for outcome in self.sender.done():
            self.in_flight.discard((outcome.key, outcome.target))
            due = next((d for d in self.dues if (d.key, d.target) == (outcome.key, outcome.target)), None)
            if due is None:
                continue
            state = outbox.record(self.store, due, outcome.error)
            if state == "sent":
                log.info("alert %s: sent to the %s", due.key, due.target)
            elif state == "pending":
                wait = due.next_at - time.time()
                log.warning(
                    "alert %s: the %s failed (%s); try %d, the next in %.0fs",
                    due.key,
                    due.target,
                    outcome.error,
                    due.tries,
                    max(0.0, wait),
                )
            else:
                log.error(
                    "alert %s: the %s failed %d times (%s); giving up",
                    due.key,
                    due.target,
                    due.tries,
                    outcome.error,
                )
            if state != "pending":
                self.dues.remove(due)

    def _send_due(self) -> None:
        assert self.dues is not None
        now = time.time()
        for due in self.dues:
            if (due.key, due.target) in self.in_flight or due.next_at > now:
                continue
            if due.target not in self.settings.targets:
                continue  # not configured now: it waits for the target to come back
            if self.sender is None:
                self.sender = Sender()
            due.tries += 1
            self.in_flight.add((due.key, due.target))
            body = json.dumps(due.payload, ensure_ascii=False).encode("utf-8")
            self.sender.submit(Delivery(due.key, due.target, body, self.settings))
