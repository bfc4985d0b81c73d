"""A batch's metric rows, made the run's own: its framework's key map, then Φ derived from entropy.

Every reader calls `finish_rows` inside the transaction that writes the rows and the cursor, so the framework
stored on the run, the renames kept in run_keys and the rows never disagree,
whatever moment a process dies at.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from engine.store import Store, metric_keys

from .frameworks import KeyMapping, detect, scale_factors
from .keys import derived_phi
from .model_vocab import model_path, model_vocab
from .reader_base import IngestResult, valid_vocab

Row = tuple[int, str, Any, float]  # (step, key, value, wall time)
PHI_KEYS = frozenset({"entropy", "phi/mean", "phi/entropy"})
TOKENS_SEEN = "num_tokens"  # TRL: prompt and completion tokens of every rank so far
STEP_TIME = "perf/step_time_s"
TOKENS_PER_S = "perf/tokens_per_s"
# Distinct metric keys one run takes from a source. Each key costs its own rollups at every level, so a
# source inventing keys (one JSONL line with 60,000 of them took 22 s) would stall the engine; real runs
# log tens to a few hundred. Past the cap, rows of the keys the run already has are still imported.
MAX_KEYS = 5_000
KEYS_CAPPED = "keys capped"  # the run's event that says so, once
MAX_CONFIG_TEXT = 16 << 20  # a run's stored config read to find its model (veRL's is tens of KiB)
MAX_REMEMBERED = 10_000


def vocab_key(source_id: int, *, fallback: bool = False) -> str:
    """The kv entry holding a |V| for a source's runs: the one the user gave (`carl observe --vocab-size`),
    which wins over everything, or the fallback discovery found beside the run (a config.json), used when the
    source itself says nothing."""
    return f"observe.vocab_size{'_fallback' if fallback else ''}.{source_id}"


def set_vocab_override(store: Store, source_id: int, vocab_size: int) -> None:
    store.set_kv(vocab_key(source_id), vocab_size)


def set_vocab_fallback(store: Store, source_id: int, vocab_size: int) -> None:
    store.set_kv(vocab_key(source_id, fallback=True), vocab_size)


def vocab_override(store: Store, source_id: int) -> int | None:
    return valid_vocab(store.kv(vocab_key(source_id)))


def finish_rows(
    store: Store,
    run_id: int,
    source_id: int,
    rows: list[Row],
    *,
    vocab_size: int | None = None,
    origin: Mapping[str, str] | None = None,
    result: IngestResult | None = None,
) -> list[Row]:
    """The rows to store for one run's batch (keys as `normalize_key` left them): at most MAX_KEYS distinct
    keys a run (`capped_keys`, which says so in `result`), renamed by the run's key map, with Φ or its entropy
    derived per step where only the other is known.

    The framework is the run's stored one, else the one the batch's keys tell (then stored on the run); the
    renames go to run_keys under the source's own spelling (`origin`). |V|: the user's `--vocab-size` for the
    source, else the reader's (the run's own config), else the run's stored one, else a config.json discovery
    found beside the run; the run keeps the one used.
    """
    if not rows:
        return rows
    rows = capped_keys(store, run_id, rows, result)
    framework, stored_vocab = metric_keys.framework_and_vocab(store, run_id)
    names = {row[1] for row in rows}
    if framework is None:
        framework = detect(names)
        if framework is not None:
            store.update_run(run_id, framework=framework)
    claimed = metric_keys.claimed_keys(store, run_id)
    mapping = KeyMapping(framework, claimed)
    renames = mapping.renames(names)
    scales = scale_factors(framework, renames, names)
    if renames:
        rows = [(step, renames.get(key, key), value, wall) for step, key, value, wall in rows]
        origin = origin or {}
        store.set_key_names(run_id, {new: origin.get(old, old) for old, new in renames.items()})
        names = {renames.get(name, name) for name in names}
    if scales:
        rows = [
            (step, key, value * scales[key] if key in scales and value is not None else value, wall)
            for step, key, value, wall in rows
        ]
    if framework == "trl" and TOKENS_SEEN in names and STEP_TIME in names and TOKENS_PER_S not in names:
        rows = with_tokens_per_s(store, run_id, rows)
    vocab = (
        vocab_override(store, source_id)
        or valid_vocab(vocab_size)
        or valid_vocab(stored_vocab)
        or valid_vocab(store.kv(vocab_key(source_id, fallback=True)))
        or config_model_vocab(store, run_id)
    )
    if vocab is not None and vocab != stored_vocab:
        store.update_run(run_id, vocab_size=vocab)
    if vocab is not None and ("entropy" in names or "phi/mean" in names):
        rows = with_derived_phi(rows, vocab)
    return rows


# run id -> (the length of the config looked at, the |V| its model gave): a config is read again only when
# it changed, so a run whose model cannot be found costs one short read a batch.
MODEL_VOCAB: dict[int, tuple[int, int | None]] = {}


def config_model_vocab(store: Store, run_id: int) -> int | None:
    """|V| of the model the run's stored config names (veRL's `actor_rollout_ref.model.path` as a tracker
    kept it, transformers' `_name_or_path`), when its config.json is on this machine (model_vocab.py)."""
    size, text = metric_keys.config_text(store, run_id)
    seen = MODEL_VOCAB.get(run_id)
    if seen is not None and seen[0] == size:
        return seen[1]
    vocab = None
    if text and size <= MAX_CONFIG_TEXT:
        try:
            path = model_path(json.loads(text))
        except (ValueError, RecursionError):
            path = None
        vocab = model_vocab(path) if path else None
    if len(MODEL_VOCAB) >= MAX_REMEMBERED:
        MODEL_VOCAB.clear()
    MODEL_VOCAB[run_id] = (size, vocab)
    return vocab


def with_tokens_per_s(store: Store, run_id: int, rows: list[Row]) -> list[Row]:
    """`rows` plus perf/tokens_per_s where TRL logged `num_tokens` and its step time: the tokens since its
    previous log (in this batch, else the run's stored one) over the steps since then, each of the logged
    mean step time (docs/reference/frameworks.md §2.2). TRL restores num_tokens on resume, so the
    difference stays the tokens of those steps; a log that does not move forward derives nothing."""
    seconds = {
        step: value for step, key, value, _ in rows if key == STEP_TIME and _finite(value) and value > 0
    }
    seen = sorted(
        (step, value, wall) for step, key, value, wall in rows if key == TOKENS_SEEN and _finite(value)
    )
    if not seen or not seconds:
        return rows
    before = store.metric_before(run_id, TOKENS_SEEN, seen[0][0])
    derived = []
    for step, tokens, wall in seen:
        if before is not None and step > before[0] and tokens > before[1] and seconds.get(step):
            derived.append(
                (step, TOKENS_PER_S, (tokens - before[1]) / ((step - before[0]) * seconds[step]), wall)
            )
        before = (step, tokens)
    return rows + derived if derived else rows


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def capped_keys(store: Store, run_id: int, rows: list[Row], result: IngestResult | None) -> list[Row]:
    """`rows` without those of new keys past the run's MAX_KEYS (the first new ones seen are kept); the
    first time keys are dropped, an event on the run and a line in `result` say so."""
    new = [
        name for name in dict.fromkeys(row[1] for row in rows) if not metric_keys.has_key(store, run_id, name)
    ]
    if not new:
        return rows  # the usual batch: every key known, the run's keys never counted
    room = MAX_KEYS - len(metric_keys.keys_of(store, run_id, MAX_KEYS + 1))
    if len(new) <= room:
        return rows
    dropped = set(new[max(room, 0) :])
    kept = [row for row in rows if row[1] not in dropped]
    if not metric_keys.has_event(store, run_id, KEYS_CAPPED):
        line = (
            f"more than {MAX_KEYS:,} distinct metric keys: the first {MAX_KEYS:,} are kept, later new keys"
            f" ({len(dropped):,} in this batch) are not imported"
        )
        store.add_event(run_id, min(row[0] for row in rows), KEYS_CAPPED, line)
        if result is not None:
            result.problems.append(f"run {run_id}: {line}")
    return kept


def with_derived_phi(rows: list[Row], vocab_size: int) -> list[Row]:
    """`rows` plus, per step, Φ from the entropy or the entropy from Φ (keys.derived_phi)."""
    per_step: dict[int, dict[str, Any]] = {}
    walls: dict[int, float] = {}
    for step, key, value, wall in rows:
        if key in PHI_KEYS:
            per_step.setdefault(step, {}).setdefault(key, value)  # the first, as INSERT OR IGNORE keeps it
            walls.setdefault(step, wall)
    derived = [
        (step, name, value, walls[step])
        for step, values in per_step.items()
        for name, value in derived_phi(values, vocab_size)
    ]
    return rows + derived if derived else rows


def backfill_phi(store: Store, run_id: int, vocab_size: int) -> int:
    """Φ for the steps a run stored an entropy but no Φ for (its |V| came later); returns rows added."""
    rows = metric_keys.entropy_without_phi(store, run_id)
    derived = [
        (step, name, value, wall)
        for step, entropy, wall in rows
        for name, value in derived_phi({"entropy": entropy}, vocab_size)
    ]
    with store.transaction():
        store.update_run(run_id, vocab_size=vocab_size)
        return store.add_metrics(run_id, derived)
