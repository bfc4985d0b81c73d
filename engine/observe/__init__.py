"""observe: import and follow runs written by other tools.

Three formats: a Trackio project database, a transformers/TRL `trainer_state.json` (or a
checkpoint or output dir holding one) and JSONL metric logs. `observe` imports a path until
caught up; the engine daemon calls `ingest_source` on every followed source each tick.
"""

from .common import IngestResult, ObserveError
from .detect import detect_kind
from .ingest import finish_import, ingest_source, observe, register_source
from .keys import derived_phi, normalize_key

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
