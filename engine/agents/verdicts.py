"""The audit's verdict on each rollout the trainer receives: the trainer trains only on what the audit
stored as admitted.

Anyone who holds the plane's token can publish on `training.rollouts`. The audit applies admission to
every event it stores (admission.py: a rollout needs a task that was assigned and a result from the worker
that took it) and keeps each as a row of `agent_events`, keyed by the stream's creation time and the
message's sequence (`stream_key`). The trainer reads that row for each rollout before it trains on it:
`ok` is trained on, `rejected` is refused with the audit's reason, and a rollout the audit has not stored
yet waits for it (the audit stores in batches, a few ms behind). A plane with no audit running stores
nothing and trains on nothing: the trainer says so, once, and waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.store.agent_audit import StoredVerdicts


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    reason: str | None  # the audit's one-line reason for a rollout it refused


class Verdicts:
    """Reads the audit's rows for a stream's messages, by sequence, from the store it writes."""

    def __init__(self, db_path: Path, epoch: str) -> None:
        self.epoch = epoch  # the stream's creation time (audit.stream_epoch): part of each stream key
        self.stored = StoredVerdicts(db_path)

    def of(self, sequences: list[int]) -> dict[int, Verdict]:
        """sequence -> the audit's verdict, for the sequences it has stored (the others are not in it)."""
        keys = {f"{self.epoch}:{seq}": seq for seq in sequences}
        return {keys[key]: Verdict(status == "ok", reason) for key, status, reason in self.stored.of(keys)}

    def close(self) -> None:
        self.stored.close()
