"""The errors the control room says in one line and goes on from: the store (or a file, or the engine's
process) could not be read, written or started. A locked, damaged or missing store is `sqlite3.Error` or
`OSError`; what carl itself reports to a user is a `CarlError` (a store of a newer schema, a log file it
refuses, an engine that did not start). Anything else is a bug: it keeps its traceback (a worker's ends the
app, and Textual prints it), as `engine.errors.guard` keeps it for `carl`."""

from __future__ import annotations

import sqlite3

from engine.errors import CarlError

ONE_LINE: tuple[type[Exception], ...] = (CarlError, sqlite3.Error, OSError)
