"""A batch's metric rows through their run's key map: the framework told once, the renames kept, Phi derived.

Readers collect rows under `keys.normalize_key` names, then, inside the transaction that stores them, pass
each run's rows through here: the run's framework is the stored one, else the one its keys tell (stored when
told), its table renames what it names (the source names go to `run_keys`), and Phi or its entropy is
derived per step once |V| is known.
"""

from __future__ import annotations

from engine.store import Store

from .frameworks import KeyMapping, detect
from .keys import derived_phi

Row = tuple[int, str, float | None, float]  # step, key, value, wall time
PHI_KEYS = frozenset({"entropy", "phi/mean", "phi/entropy"})  # what derived_phi looks at


def map_rows(store: Store, run_id: int, rows: list[Row], vocab_size: int | None) -> list[Row]:
    """`rows` under their canonical names, with derived Phi rows added; inside the batch's transaction."""
    if not rows:
        return rows
    keys = {row[1] for row in rows}
    framework = store.conn.execute("SELECT framework FROM runs WHERE id=?", (run_id,)).fetchone()[0]
    if framework is None:
        framework = detect(keys)  # None until a batch holds keys that tell: asked again next batch
        if framework is not None:
            store.update_run(run_id, framework=framework)
    mapping = KeyMapping(framework)
    names = {key: mapping.canonical(key) for key in keys}
    if any(key != name for key, name in names.items()):
        rows = [(step, names[key], value, wall) for step, key, value, wall in rows]
    store.set_key_names(run_id, mapping.take_renamed())
    if vocab_size and not PHI_KEYS.isdisjoint(names.values()):
        rows.extend(phi_rows(rows, vocab_size))
    return rows


def phi_rows(rows: list[Row], vocab_size: int) -> list[Row]:
    """Phi from the entropy (or the entropy from Phi) of each step whose rows carry only one of them."""
    by_step: dict[int, dict[str, float | None]] = {}
    walls: dict[int, float] = {}
    for step, key, value, wall in rows:
        if key in PHI_KEYS:
            by_step.setdefault(step, {})[key] = value
            walls[step] = wall
    derived: list[Row] = []
    for step, values in by_step.items():
        if any(value is None for value in values.values()):
            continue  # a NaN (stored as NULL) derives nothing
        derived.extend((step, key, value, walls[step]) for key, value in derived_phi(values, vocab_size))
    return derived
