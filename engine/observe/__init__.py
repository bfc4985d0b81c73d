"""observe: import and follow runs written by other tools.

One reader per format (docs/guide/observe.md has the table): TensorBoard event files, W&B run files, MLflow
stores, Trackio databases, `trainer_state.json`, JSONL logs (ours, veRL's, prime-rl's), and the rollout dumps
of TRL, veRL, prime-rl and verifiers. discover.py finds the runs of a directory; frameworks.py maps each
framework's keys onto one vocabulary. `observe` imports a path until caught up; the engine daemon calls
`ingest_source` on every followed source each tick.
"""

from .detect import detect_kind
from .ingest import finish_import, ingest_source, observe, register_source
from .keys import derived_phi, normalize_key
from .reader_base import IngestResult, ObserveError

__all__ = [
    "IngestResult",
    "ObserveError",
    "derived_phi",
    "detect_kind",
    "finish_import",
    "ingest_source",
    "normalize_key",
    "observe",
    "register_source",
]
