"""The console of a W&B run: `files/output.log` where wandb writes one, else a copy of the run file's output
records.

wandb 0.31 and 0.19 write what a script prints to `files/output.log` as it runs, offline too; wandb 0.29
offline keeps it only in the run file, as `output_raw` records (`output` in older writers) until `wandb sync`.
So a run's console is decided once per run file (the cursor entry's `console`): "file" when output.log is
there with something in it, else "copy" once output records arrive: their text is appended to
`consoles/wandb-<source>-<run>.log` beside carl.db (never in the run's folder, which may be read-only), and
that file is the run's console for the log view (`L`) and the traceback scan (engine/console/). The copy is
cut back to the length its cursor entry committed before each append, so a batch that died before its commit
writes nothing twice; it stops growing at MAX_CONSOLE_BYTES, said once.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from engine.names import slug
from engine.store import Store

from .reader_base import IngestResult

OUTPUT_LOG = "files/output.log"  # the console wandb writes (its `console` setting)
CONSOLE_DIR = "consoles"  # beside carl.db
MAX_CONSOLE_BYTES = 256 << 20  # a copied console stops growing here


def copy_path(store: Store, source_id: int, external_id: str) -> Path:
    return store.path.parent / CONSOLE_DIR / f"wandb-{source_id}-{slug(external_id)}.log"


def register(
    store: Store,
    run_id: int,
    source_id: int,
    run_file: Path,
    external_id: str,
    text: list[str],
    entry: dict[str, Any],
    result: IngestResult,
) -> None:
    """Name the run's console (and append `text`, the output records read, to its copy); inside the batch's
    transaction, with `entry` (the run file's cursor entry) committed by it."""
    mode = entry.get("console")
    output_log = run_file.parent / OUTPUT_LOG
    if mode is None:
        if _has_text(output_log):
            mode = "file"
        elif text:
            mode = "copy"
        else:
            return  # nothing printed yet: decided when something is
        entry["console"] = mode
    if mode == "file":
        store.system.add_console(run_id, str(output_log), "wandb")
    elif mode == "copy":
        path = copy_path(store, source_id, external_id)
        if text:
            _append(path, entry, "".join(text), result)
        if entry.get("console") == "copy":
            store.system.add_console(run_id, str(path), "wandb")


def _has_text(path: Path) -> bool:
    """A regular file with something in it (wandb 0.19 makes output.log empty and fills it at the end)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def _append(path: Path, entry: dict[str, Any], text: str, result: IngestResult) -> None:
    committed = int(entry.get("console_bytes", 0))
    data = text.encode("utf-8", "replace")
    room = MAX_CONSOLE_BYTES - committed
    if room <= 0:
        return
    if len(data) > room:
        data = data[:room]
        result.add_problem(
            f"{path.name}: the console copy reached {MAX_CONSOLE_BYTES >> 20} MiB; the rest is not kept"
        )
    try:
        path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        with open(path, "a+b") as f:
            f.truncate(committed)  # what a batch wrote and did not commit goes
            f.seek(committed)
            f.write(data)
    except OSError as exc:
        result.add_problem(f"{path}: cannot write the run's console copy ({exc.strerror}); not kept")
        entry["console"] = "off"
        return
    entry["console_bytes"] = committed + len(data)
