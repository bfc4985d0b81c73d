"""The alerts the engine owes, kept in the store's kv so that a restart neither repeats nor loses one.

One entry per run and cause (`alert/run/<id>/<cause>`) or per agents alarm kind and worker
(`alert/agents/<kind>/<worker>`): its existence is the "at most once" (an entry is never made twice), and its
targets say how far delivery got:

    {"payload": {...},
     "targets": {"webhook": {"state": "pending", "tries": 0, "next_at": 0.0, "error": null}}}

A target is `pending` until a try succeeds (`sent`) or the tries run out (`failed`); after each failed try the
next waits RETRY_DELAYS_S[tries - 1] seconds. An engine that dies between a successful try and writing `sent`
sends that alert once more when it comes back: the one repeat there can be.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from engine.store import Store

PREFIX = "alert/"
RETRY_DELAYS_S = (
    1.0,
    2.0,
    4.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
)  # about four minutes of tries, then it gives up


def run_key(run_id: int, cause: str) -> str:
    return f"{PREFIX}run/{run_id}/{cause}"


def alarm_key(kind: str, worker: str | None) -> str:
    return f"{PREFIX}agents/{kind}/{worker or '-'}"


@dataclass
class Due:
    """A pending target of an alert: when its next try may start."""

    key: str
    target: str
    payload: dict[str, Any]
    tries: int
    next_at: float


def known(store: Store, key: str) -> bool:
    return store.has_kv(key)


def add(store: Store, key: str, payload: dict[str, Any], targets: tuple[str, ...]) -> list[Due]:
    """A new alert, pending on each target; its dues."""
    entry = {
        "payload": payload,
        "targets": {t: {"state": "pending", "tries": 0, "next_at": 0.0, "error": None} for t in targets},
    }
    store.set_kv(key, entry)
    return [Due(key, t, payload, 0, 0.0) for t in targets]


def pending(store: Store) -> list[Due]:
    """Every pending target of every alert (read once, when the engine starts)."""
    out = []
    for key, value in store.kv_texts(PREFIX, "alert0"):
        try:
            entry = json.loads(value)
            for target, state in entry["targets"].items():
                if state["state"] == "pending":
                    out.append(
                        Due(key, target, entry["payload"], int(state["tries"]), float(state["next_at"]))
                    )
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not one of ours, or damaged: never a reason to stop
    return out


def record(store: Store, due: Due, error: str | None) -> str:
    """The outcome of a try of `due`: its new state (sent, pending with a later next_at, or failed)."""
    if error is None:
        state = "sent"
    elif due.tries <= len(RETRY_DELAYS_S):
        state = "pending"
        due.next_at = time.time() + RETRY_DELAYS_S[due.tries - 1]
    else:
        state = "failed"
    value = store.kv(due.key) or {"payload": due.payload, "targets": {}}
    value["targets"][due.target] = {
        "state": state,
        "tries": due.tries,
        "next_at": due.next_at,
        "error": error,
    }
    store.set_kv(due.key, value)
    return state
