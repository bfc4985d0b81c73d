"""A console read for findings a bounded batch at a time, from where the last batch stopped.

The position (`run_consoles.scanned`) and what was found before it are committed together
(`store.system.save_console_scan`), so a scan resumes after a restart and never finds a thing twice. The
file's identity (device, inode) and the lines before the position are kept with it: a file replaced (rotated)
or shorter than the position (truncated) is read again from its start. What is found is a traceback, a CUDA
out-of-memory or an NCCL error (engine/console/problems.py), with the file's line number of its first line.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .logfile import LogFile
from .problems import find_problems

if TYPE_CHECKING:
    from engine.store import Store

SCAN_BYTES = 4 << 20  # of one console per batch


@dataclass
class Scanned:
    new: int = 0  # findings stored
    read: int = 0  # bytes read
    restarted: str = ""  # why it started over (truncated, replaced), once
    more: bool = False  # a whole batch was read: more is waiting


def scan_console(
    store: Store, console: dict[str, Any], *, budget: int = SCAN_BYTES, final: bool = False
) -> Scanned:
    """Read the next batch of a registered console (a `store.system.consoles()` row) and store what it finds.
    `final`: the file has stopped growing, so its last line needs no newline and a traceback without its
    exception line is taken as it is. A path that is missing, or is not a regular file, is left as it is
    (LogFileError or OSError from `os.stat` tell why)."""
    path = console["path"]
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        from engine.files import kind_of

        raise OSError(f"{path}: {kind_of(st.st_mode)}, not a log file")
    identity = console["identity"] or {}
    scanned, lines = int(console["scanned"]), int(identity.get("lines", 0))
    out = Scanned()
    if identity and (identity.get("dev"), identity.get("ino")) != (st.st_dev, st.st_ino):
        out.restarted = "replaced (rotated)"
    elif st.st_size < scanned:
        out.restarted = "truncated"
    if out.restarted:
        scanned = lines = 0
    if st.st_size <= scanned and not out.restarted:
        return out
    with LogFile.open(path) as file:
        data = file.read(scanned, min(budget, max(0, file.size() - scanned)))
    out.read = len(data)
    whole = scanned + len(data) >= st.st_size
    found, done = find_problems(data, scanned, final=final and whole)
    if done == scanned and len(data) >= budget:
        done = scanned + len(data)  # one line longer than a batch: past it (what it held is not a finding)
    findings = []
    at, counted = lines, 0
    for problem in found:
        at += data.count(b"\n", counted, problem.offset - scanned)
        counted = problem.offset - scanned
        findings.append((problem.kind, problem.offset, problem.line, at + 1))
    lines = at + data.count(b"\n", counted, done - scanned)
    ident = {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "lines": lines}
    out.new = store.system.save_console_scan(console["id"], console["run_id"], done, ident, findings)
    out.more = len(data) >= budget
    return out
