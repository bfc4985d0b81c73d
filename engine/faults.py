"""Telling the store's trouble from one bad input's, for writers that must never stop on the latter.

A writer that meets an error has two choices: try the same thing again later (the store was locked,
the disk full: nothing about the input was wrong), or set that one input aside as rejected and go on
(a number beyond SQLite's integers, text it cannot encode). Retrying a bad input for ever stops the
writer for good; rejecting good input because the disk was full loses it. `store_trouble` decides.
"""

from __future__ import annotations

import sqlite3


def store_trouble(exc: BaseException) -> bool:
    """Whether `exc` is the store's own trouble (locked, full, unreadable, the disk), worth trying the
    same work again, rather than one input the store cannot take (OverflowError, UnicodeEncodeError,
    an integrity or binding error), which should be set aside."""
    return isinstance(exc, sqlite3.OperationalError | OSError) or type(exc) is sqlite3.DatabaseError
