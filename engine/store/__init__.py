"""carl.db: the single source of truth. `Store` writes, `StoreReader` watches.

`Store` (sqlite-utils) is imported lazily: the control room only needs the reader.
"""

from typing import TYPE_CHECKING, Any

from .base import MetricRow, StoreError, check_schema, connect, in_chunks, insert_command
from .reader import RunRow, Series, StoreReader
from .schema import ROLLUP_LEVELS, SCHEMA_VERSION
from .system import ProcessRow
from .system_reads import TimeSeries

if TYPE_CHECKING:
    from .db import PHI_METRIC_KEYS, Store

__all__ = [
    "PHI_METRIC_KEYS",
    "ROLLUP_LEVELS",
    "SCHEMA_VERSION",
    "MetricRow",
    "ProcessRow",
    "RunRow",
    "Series",
    "Store",
    "StoreError",
    "StoreReader",
    "TimeSeries",
    "check_schema",
    "connect",
    "in_chunks",
    "insert_command",
]


def __getattr__(name: str) -> Any:
    if name in ("Store", "PHI_METRIC_KEYS"):
        from . import db

        return getattr(db, name)
    raise AttributeError(name)
