"""carl.db: the single source of truth. `Store` writes, `StoreReader` watches."""

from .db import PHI_METRIC_KEYS, MetricRow, Store, StoreError, check_schema
from .reader import RunRow, Series, StoreReader
from .schema import ROLLUP_LEVELS, SCHEMA_VERSION

__all__ = [
    "PHI_METRIC_KEYS", "ROLLUP_LEVELS", "SCHEMA_VERSION", "MetricRow", "RunRow", "Series", "Store",
    "StoreError", "StoreReader", "check_schema",
]  # fmt: skip
