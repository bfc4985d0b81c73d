"""`carl observe DIR`: every training run in an output directory, and the sources to read each from.

What is looked for (docs/guide/observe.md, "How a directory becomes runs"):
- TensorBoard: each folder holding `events.out.tfevents.*` files is a run (TRL:
  `<output_dir>/runs/<date_host>/`);
- W&B: each `run-*` / `offline-run-*` folder holding a `.wandb` file is a run
  (a `wandb/` folder holds several);
- transformers/TRL `trainer_state.json` in an output dir (or its newest `checkpoint-*/`);
- JSONL metric logs: veRL's file logger (`{"step": N, "data": {...}}`), prime-rl's `metrics.jsonl`, flat logs;
- MLflow stores (`mlruns/`, `mlflow.db`) and Trackio project databases, each read whole (every run in it);
- rollouts: TRL's `completions/` parquet files, veRL's `rollout_data_dir` dumps (`<step>.jsonl`), prime-rl's
  `rollouts/step_N/...`, verifiers' `results.jsonl`.

How files become runs, one carl run per training run:
1. A TensorBoard run and a W&B run that started within PAIR_SECONDS of each other logged the same training run
   (TensorBoard's start is in its event file's name, W&B's in its run folder's name).
2. An output dir's `trainer_state.json` belongs to the newest TensorBoard or W&B run of that dir (transformers
   rewrites it for each run there); with none, it is the run's only metrics source.
3. Of the trackers that logged one run, one is read: TensorBoard, else W&B, else trainer_state.json (a tracker
   whose package is not installed comes last); the others are reported as "also found ... (the same run)".
4. A rollout source joins (`sources.attach_to`) the newest run whose home holds it (an output dir; a log's
   folder; for veRL's `<root>/<project>/<experiment>.jsonl`, its <root>); with none, the only run found; else
   it is a run of its own.

The walk is bounded (depth, entries), skips hidden folders, symlinks and checkpoint folders, and reads at most
a few KiB of a file to tell what it is; nothing found is opened for writing.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.util import find_spec
from pathlib import Path

from engine.files import open_regular
from engine.store import Store
from engine.text import storable, visible_line

from . import mlflow_store, model_vocab, pairing, trackio, trainer_state
from .detect import SQLITE_HEADER
from .frameworks import NAMES, detect
from .ingest import register_source, set_joined
from .keys import normalize_key
from .reader_base import MULTI_RUN_KINDS, ObserveError
from .rollouts import verifiers
from .runkeys import set_vocab_fallback

MAX_DEPTH = 8
MAX_ENTRIES = 200_000
PAIR_SECONDS = pairing.PAIR_SECONDS
HEAD_BYTES = 64 * 1024
SKIP_DIRS = frozenset({"node_modules", "__pycache__", "site-packages"})
EVENT_FILE = re.compile(r"events\.out\.tfevents\.(\d+)")
WANDB_RUN = re.compile(r"(?:offline-)?run-(\d{8}_\d{6})-([A-Za-z0-9]+)$")
STEP_FILE = re.compile(r"\d+\.jsonl$")
STEP_DIR = re.compile(r"step_\d+$")
SQLITE_SUFFIXES = {".db", ".sqlite", ".sqlite3"}
MAX_NOTES = 20
METRIC_KINDS = ("tensorboard", "wandb", "trainer_state")  # the order of preference for one run
# kind -> (the package its reader needs, the extra that installs it)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "rollouts-trl": ("pyarrow", "parquet"),
}
MULTI_RUN = MULTI_RUN_KINDS  # stores of many runs: no rollouts join them, one of their runs may join another
PAIRINGS = ("auto", "join", "separate")


@dataclass
class Found:
    """One source: what to register (kind, path) and what it is, for the user."""

    kind: str
    path: Path
    what: str
    home: Path  # the folder of the run it belongs to (an output dir, a log's folder)
    started: float = 0.0  # for pairing trackers and telling the newest run
    ended: float = 0.0  # when it was last written (pairing.py compares these where a start is not known)
    external_id: str | None = None  # one run of a store of many (MLflow, Trackio) that joins another run

    @property
    def readable(self) -> bool:
        """Whether the package its reader needs is installed (an extra)."""
        return self.kind not in PACKAGES or installed(PACKAGES[self.kind][0])


@cache
def installed(package: str) -> bool:
    return find_spec(package) is not None


@dataclass
class FoundRun:
    """One training run: the source its metrics come from (None: rollouts only), what joins it, what else
    logged it."""

    metrics: Found | None
    rollouts: list[Found] = field(default_factory=list)
    same: list[Found] = field(default_factory=list)  # logged it too, but not read (told by time alone)
    joined: list[Found] = field(default_factory=list)  # logged it too, and read into the same carl run
    name: str | None = None
    vocab_size: int | None = None  # from a config.json in its output dir or newest checkpoint

    @property
    def main(self) -> Found:
        return self.metrics or self.rollouts[0]

    @property
    def started(self) -> float:
        return max((f.started for f in self.trackers), default=0.0)

    @property
    def trackers(self) -> list[Found]:
        """Every metrics source that logged the run: the main one, those joined, those only reported."""
        return [f for f in (self.metrics, *self.joined, *self.same) if f is not None]


@dataclass
class Discovery:
    root: Path
    runs: list[FoundRun]
    notes: list[str] = field(default_factory=list)  # one line each: what was seen but not read, bounds hit


# -- the walk ------------------------------------------------------------------------------------------------


@dataclass
class Seen:
    """What the walk found, before grouping."""

    metrics: list[Found] = field(default_factory=list)  # TensorBoard, W&B, JSONL logs, stores
    states: list[Found] = field(default_factory=list)  # trainer_state output dirs
    rollouts: list[Found] = field(default_factory=list)
    entries: int = 0
    truncated: bool = False
    notes: list[str] = field(default_factory=list)  # entries skipped, one line each


def discover(root: str | Path, pairing: str = "auto") -> Discovery:
    """Every run under `root` (a directory), grouped into training runs; ObserveError when there is none.

    `pairing`: "auto" (sources that hold the same values are one run, pairing.py), "join" (every source found
    is one run: `carl observe --join`), "separate" (each source a run of its own: `--separate`)."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise ObserveError(f"{visible_line(str(root))}: not a directory")
    if pairing not in PAIRINGS:
        raise ObserveError(f"pairing {pairing!r}: one of {', '.join(PAIRINGS)}")
    seen = Seen()
    _walk(root, 0, seen)
    found = Discovery(root, _group(seen, pairing), seen.notes)
    bounds = f"stopped looking after {MAX_ENTRIES:,} entries or {MAX_DEPTH} levels: name a subfolder"
    if seen.truncated:
        found.notes.append(bounds)
    for run in found.runs:
        for source in (run.metrics, *run.joined, *run.rollouts):
            if source is not None and not source.readable:
                package, extra = PACKAGES[source.kind]
                found.notes.append(
                    f"{relative(source.path, root)}: reading {source.what} needs {package}:"
                    f" pip install 'carl-tui[{extra}]'"
                )
    if not found.runs:
        raise ObserveError(
            f"{visible_line(str(root))}: no runs found (looked for TensorBoard event files, W&B runs, "
            "trainer_state.json, JSONL logs, MLflow and Trackio stores, rollout dumps"
            + (f"; {bounds}" if seen.truncated else "")
            + ")"
        )
    return found


def _walk(folder: Path, depth: int, seen: Seen) -> None:
    if depth > MAX_DEPTH or seen.entries >= MAX_ENTRIES:
        seen.truncated = True
        return
    try:
        listed = list(os.scandir(folder))
    except OSError:
        return
    entries = sorted((e for e in listed if storable(e.name) == e.name), key=lambda e: e.name)
    for entry in listed:
        if storable(entry.name) != entry.name and len(seen.notes) < MAX_NOTES:
            name = visible_line(storable(entry.path))
            seen.notes.append(f"{name}: skipped, its name is not valid UTF-8 (rename it to import it)")
    seen.entries += len(entries)
    files = [e for e in entries if e.is_file(follow_symlinks=False)]
    dirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
    names = {e.name for e in files}
    if _folder_kind(folder, files, dirs, seen):
        return  # a TensorBoard or W&B run, a store, rollouts: read whole, not walked into
    has_state = trainer_state.FILE_NAME in names or any(trainer_state.CHECKPOINT.match(d.name) for d in dirs)
    state = trainer_state.resolve(folder) if has_state else None
    if state is not None:
        seen.states.append(
            Found("trainer_state", folder, "trainer_state.json", folder, _mtime(folder), _mtime(state))
        )
    for entry in files:
        _file_kind(folder, Path(entry.path), seen)
    for entry in dirs:
        if (
            entry.name.startswith(".")
            or entry.name in SKIP_DIRS
            or trainer_state.CHECKPOINT.match(entry.name)
        ):
            continue
        _walk(Path(entry.path), depth + 1, seen)


def _folder_kind(folder: Path, files: list[os.DirEntry], dirs: list[os.DirEntry], seen: Seen) -> bool:
    """Record `folder` when it is a source as a whole; True when its contents are not to be walked."""
    events = [m for e in files if (m := EVENT_FILE.match(e.name))]
    if events:  # a TensorBoard run; sub-folders (add_scalars) belong to it
        home = folder.parent.parent if folder.parent.name == "runs" else folder
        started = min(float(m[1]) for m in events)
        ended = max(_mtime(Path(e.path)) for e in files if EVENT_FILE.match(e.name))
        seen.metrics.append(Found("tensorboard", folder, "TensorBoard run", home, started, ended))
        return True
    wandb = WANDB_RUN.match(folder.name)
    if wandb and any(e.name.endswith(".wandb") for e in files):
        try:
            started = time.mktime(time.strptime(wandb[1], "%Y%m%d_%H%M%S"))  # wandb names it in local time
        except (ValueError, OverflowError):
            started = _mtime(folder)
        home = folder.parent.parent if folder.parent.name == "wandb" else folder.parent
        ended = max(_mtime(Path(e.path)) for e in files if e.name.endswith(".wandb"))
        seen.metrics.append(Found("wandb", folder, "W&B run", home, started, ended))
        return True
    if mlflow_store.is_mlruns_dir(folder):
        seen.metrics.append(
            Found("mlflow", folder, "MLflow store (each of its runs)", folder, _mtime(folder))
        )
        return True
    if folder.name == "completions" and any(e.name.endswith(".parquet") for e in files):
        seen.rollouts.append(Found("rollouts-trl", folder, "TRL completions", folder.parent, _mtime(folder)))
        return True
    if folder.name == "rollouts" and any(STEP_DIR.match(d.name) for d in dirs):
        seen.rollouts.append(
            Found("rollouts-prime", folder, "prime-rl rollouts", folder.parent, _mtime(folder))
        )
        return True
    steps = sorted((e for e in files if STEP_FILE.match(e.name)), key=lambda e: int(e.name.split(".")[0]))
    if steps and _is_sample(_first_object(Path(steps[0].path)), ("input", "output")):
        seen.rollouts.append(
            Found("rollouts-verl", folder, "veRL rollout dump", folder.parent, _mtime(folder))
        )
        # walked on: veRL may dump into the folder its log is in (the step files are not metrics)
    return False


def _file_kind(folder: Path, path: Path, seen: Seen) -> None:
    if path.suffix.lower() == ".jsonl":
        if path.name == verifiers.TRACES_FILE and _is_verifiers_traces(path):
            seen.rollouts.append(
                Found("rollouts-verifiers", path, "verifiers traces", folder, _mtime(path), _mtime(path))
            )
            return
        first = _first_object(path)
        if first is None:
            return
        if path.name == verifiers.FILE_NAME and _is_sample(first, ("prompt", "completion")):
            seen.rollouts.append(Found("rollouts-verifiers", path, "verifiers results", folder, _mtime(path)))
        elif _is_metrics_line(first):
            # veRL's file logger writes <root>/<project>/<experiment>.jsonl,
            # <root> being where the run started
            home = folder.parent if isinstance(first.get("data"), dict) else folder
            mtime = _mtime(path)
            seen.metrics.append(Found("jsonl", path, _jsonl_what(first), home, mtime, mtime))
    elif path.suffix.lower() in SQLITE_SUFFIXES and _head(path, 16).startswith(SQLITE_HEADER):
        if mlflow_store.is_mlflow_db(path):
            seen.metrics.append(
                Found("mlflow", path, "MLflow store (each of its runs)", folder, _mtime(path))
            )
            return
        try:
            trackio.check(path)
        except ObserveError:
            return  # another SQLite file (ours included)
        seen.metrics.append(
            Found("trackio", path, "Trackio project (each of its runs)", folder, _mtime(path))
        )


def _is_verifiers_traces(path: Path) -> bool:
    """verifiers 0.4's `traces.jsonl`: episodes (an object with `task` and a `traces` list), or still empty in
    a run dir vf-eval set up (`configs/`, written with it before the first episode lands). An episode longer
    than HEAD_BYTES is told by its start: pydantic writes `id`, `env`, `task` first."""
    head = _head(path, HEAD_BYTES)
    if not head.strip():
        return (path.parent / "configs").is_dir()
    line, newline, _ = head.lstrip().partition(b"\n")
    if not newline:
        return line.startswith(b'{"id":') and b'"task":' in line
    try:
        return verifiers.is_episode(json.loads(line))
    except (ValueError, RecursionError):
        return False


def _first_object(path: Path) -> dict | None:
    line = next((x for x in _head(path, HEAD_BYTES).split(b"\n") if x.strip()), b"")
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _is_sample(obj: dict | None, fields: tuple[str, ...]) -> bool:
    return obj is not None and all(f in obj for f in fields)


def _is_metrics_line(obj: dict) -> bool:
    """A JSONL metrics line: a step and numbers (flat, or in veRL's `data`), not a rollout sample."""
    if not any(k in obj for k in ("step", "global_step", "train/global_step")):
        return False
    if any(k in obj for k in ("prompt", "completion", "input", "output")):
        return False
    data = found if isinstance(found := obj.get("data"), dict) else obj
    return any(type(v) in (int, float) and k not in ("step", "time", "timestamp") for k, v in data.items())


def _jsonl_what(obj: dict) -> str:
    verl = isinstance(obj.get("data"), dict)
    keys = obj["data"].keys() if verl else obj.keys()
    framework = detect(k for k in (normalize_key(key, jsonl=True) for key in keys) if k is not None)
    if verl:
        return "veRL log"
    return f"{NAMES[framework]} JSONL log" if framework else "JSONL log"


def _head(path: Path, size: int) -> bytes:
    """The first bytes of a regular file; b"" for anything else (a FIFO is never opened)."""
    try:
        with open_regular(path, error=ObserveError) as f:
            return f.read(size)
    except (ObserveError, OSError):
        return b""


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def relative(path: Path, root: Path) -> str:
    """`path` under `root`, as text safe to print on one line."""
    try:
        return visible_line(str(path.relative_to(root)) or ".")
    except ValueError:
        return visible_line(str(path))


# -- grouping ------------------------------------------------------------------------------------------------


def _group(seen: Seen, pairing: str = "auto") -> list[FoundRun]:
    if pairing == "separate":
        runs = [FoundRun(m) for m in (*seen.metrics, *seen.states)]
    elif pairing == "join":
        runs = _join_all(seen)
    else:
        runs = _pair(seen)
    metric_runs = list(runs)
    for rollout in seen.rollouts:
        owner = _owner(rollout, metric_runs)
        if owner is None:
            runs.append(FoundRun(None, [rollout]))
        else:
            owner.rollouts.append(rollout)
    _name(runs)
    for run in runs:
        if run.metrics is not None and run.metrics.kind not in MULTI_RUN:
            run.vocab_size = config_vocab(run.metrics.home, run.metrics.path)
    return sorted(runs, key=lambda r: (str(r.main.home), r.started, str(r.main.path)))


def _pair(seen: Seen) -> list[FoundRun]:
    """Sources that hold the same values logged one run (pairing.py) and are read into it; of the rest, a
    W&B run started with a TensorBoard run, and an output dir's trainer_state.json, are reported as the same
    run (told by time and place alone, they are not read into it)."""
    units = pairing.peek(pairing.worth_peeking([*seen.metrics, *seen.states]))
    runs: list[FoundRun] = []
    taken: set[int] = set()
    for group in pairing.groups(units):
        main, *rest = group
        run = FoundRun(main.found)
        for unit in rest:
            if unit.external_id is None:
                run.joined.append(unit.found)
                taken.add(id(unit.found))
            else:
                run.joined.append(_store_run(unit))
        taken.add(id(main.found))
        _keep_unreadable_apart(run)
        runs.append(run)
    metrics = [m for m in seen.metrics if id(m) not in taken]
    for found in [m for m in metrics if not m.readable and m.kind in pairing.STARTS_KNOWN]:
        owner = _started_with(found, runs)
        if owner is not None:  # not peeked (its package is missing): told by its start alone
            owner.same.append(found)
            metrics.remove(found)
    runs += [FoundRun(m) for m in metrics if m.kind != "wandb"]
    _pair_wandb(runs, [m for m in metrics if m.kind == "wandb"])
    for state in seen.states:
        if id(state) in taken:
            continue
        owners = [r for r in runs if r.metrics is not None and r.metrics.kind in ("tensorboard", "wandb")]
        owners = [r for r in owners if state.home in {f.home for f in r.trackers}]
        owners = [r for r in owners if "trainer_state" not in {f.kind for f in r.trackers}]
        if owners:
            max(owners, key=lambda r: r.started).same.append(state)
        else:
            runs.append(FoundRun(state))
    for run in runs:
        _prefer_readable(run)
    return runs


def _started_with(found: Found, runs: list[FoundRun]) -> FoundRun | None:
    """The run whose tracker of another kind started nearest `found`, within PAIR_SECONDS, if any."""
    near = [
        (abs(f.started - found.started), run)
        for run in runs
        if found.kind not in {t.kind for t in run.trackers}
        for f in run.trackers
        if f.kind in pairing.STARTS_KNOWN and abs(f.started - found.started) <= PAIR_SECONDS
    ]
    return min(near, key=lambda n: n[0])[1] if near else None


def _join_all(seen: Seen) -> list[FoundRun]:
    """`--join`: every source found logged one run. A store of many runs joins it when it holds one run."""
    single = [m for m in (*seen.metrics, *seen.states) if m.kind not in MULTI_RUN]
    stores = [m for m in seen.metrics if m.kind in MULTI_RUN]
    runs = [FoundRun(s) for s in stores]
    if not single:
        return runs
    ranked = sorted(single, key=lambda f: pairing.main_rank(pairing.Unit(f)))
    run = FoundRun(ranked[0], joined=ranked[1:])
    units = pairing.peek(stores)
    for store in stores:
        [*mine] = (u for u in units if u.found is store)
        if len(mine) == 1 and mine[0].external_id is not None:
            run.joined.append(_store_run(mine[0]))
    _keep_unreadable_apart(run)
    return [run, *runs]


def _store_run(unit: pairing.Unit) -> Found:
    """One run of a store of many, as a source that joins another run."""
    what = f"{unit.found.what.split(' (')[0]}, its run {visible_line(str(unit.external_id))}"
    return replace(unit.found, what=what, external_id=unit.external_id)


def _keep_unreadable_apart(run: FoundRun) -> None:
    """A joined source whose reader's package is missing is only reported (`same`), with the note that says
    which extra reads it."""
    run.same += [f for f in run.joined if not f.readable]
    run.joined = [f for f in run.joined if f.readable]


def _pair_wandb(runs: list[FoundRun], wandb: list[Found]) -> None:
    """A W&B run joins the TensorBoard run that started nearest it, within PAIR_SECONDS, one to one (as
    `same`: reported, not read, since time alone does not show they hold the same steps)."""
    boards = [
        r
        for r in runs
        if r.metrics is not None
        and r.metrics.kind == "tensorboard"
        and "wandb" not in {f.kind for f in r.trackers}
    ]
    pairs = sorted(
        (abs(w.started - r.main.started), i, j)
        for i, w in enumerate(wandb)
        for j, r in enumerate(boards)
        if abs(w.started - r.main.started) <= PAIR_SECONDS
    )
    taken_w: set[int] = set()
    taken_r: set[int] = set()
    for _, i, j in pairs:
        if i not in taken_w and j not in taken_r:
            boards[j].same.append(wandb[i])
            taken_w.add(i)
            taken_r.add(j)
    runs.extend(FoundRun(w) for i, w in enumerate(wandb) if i not in taken_w)


def _prefer_readable(run: FoundRun) -> None:
    """Of trackers told the same run by time alone, the metrics come from the first of TensorBoard, W&B,
    trainer_state.json whose package is installed."""
    trackers = [f for f in (run.metrics, *run.same) if f is not None]
    if run.metrics is None or run.metrics.kind not in METRIC_KINDS or run.joined:
        return
    ranked = sorted(trackers, key=lambda f: METRIC_KINDS.index(f.kind))
    run.metrics = next((f for f in ranked if f.readable), ranked[0])
    run.same = [f for f in ranked if f is not run.metrics]


def _owner(rollout: Found, runs: list[FoundRun]) -> FoundRun | None:
    """The newest run whose home holds the rollouts (the deepest home wins); else the only run found."""
    runs = [r for r in runs if r.metrics is not None and r.metrics.kind not in MULTI_RUN]
    holders = []
    for run in runs:
        for f in run.trackers:
            if f is not None and rollout.path.is_relative_to(f.home):
                holders.append((len(f.home.parts), run.started, run))
                break
    if holders:
        return max(holders, key=lambda h: (h[0], h[1]))[2]
    return runs[0] if len(runs) == 1 else None


def _name(runs: list[FoundRun]) -> None:
    """A TensorBoard run in an output dir is named after the dir (its own folder is a date and a host)."""
    for run in runs:
        main = run.main
        if main.kind == "tensorboard" and main.path.parent.name == "runs":
            siblings = [r for r in runs if r.main.kind == "tensorboard" and r.main.home == main.home]
            run.name = main.home.name if len(siblings) == 1 else f"{main.home.name}/{main.path.name}"
        elif main.kind == "jsonl" and main.path.name == "metrics.jsonl":
            run.name = main.home.name  # prime-rl's file name says nothing of the run


def config_vocab(home: Path, source: Path | None = None) -> int | None:
    """|V| from the model's config.json in a run's output dir, else in its newest checkpoint (transformers'
    `checkpoint-N/`, veRL's `global_step_N/actor/huggingface/`: model_vocab.py)."""
    folders = [home]
    newest = trainer_state.newest_checkpoint(home)
    if newest is not None:
        folders.append(newest.parent)
    for folder in folders:
        vocab = model_vocab.config_file_vocab(folder / "config.json")
        if vocab is not None:
            return vocab
    return model_vocab.verl_checkpoint_vocab(model_vocab.verl_checkpoint_folders(home, source))


def describe(found: Discovery, run: FoundRun) -> str:
    """One line: what the run is read from, what joins it, what else logged it."""
    rel = lambda f: relative(f.path, found.root)  # noqa: E731
    line = f"{run.main.what}: {rel(run.main)}"
    if run.metrics is None:
        line += " (rollouts only)"
    line += "".join(f" + {f.what}: {rel(f)}" for f in run.joined)
    line += "".join(f" + {f.what}: {rel(f)}" for f in run.rollouts[(0 if run.metrics else 1) :])
    if run.same:
        line += "; also found " + ", ".join(f"{f.what}: {rel(f)}" for f in run.same) + " (the same run)"
    return line


# -- registering ---------------------------------------------------------------------------------------------


@dataclass
class Registered:
    """A found run's sources as registered: the main one (metrics, or the rollouts of a rollouts-only run),
    then the rollout sources attached to it. `errors`: one line per source that could not be registered."""

    run: FoundRun
    sources: list[tuple[int, Found]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def register(
    store: Store, found: Discovery, *, follow: bool, name: str | None = None, pairing: str = "auto"
) -> list[Registered]:
    """Register every found run's sources: its main metrics source, the sources joined to it (`set_joined`:
    their rows go into its run), the rollouts attached to it (`sources.attach_to`).

    Each is registered unfollowed first, then followed once every join is set, so the engine never reads a
    joined source as a run of its own. An earlier join is undone only by `pairing="separate"`
    (`--separate`): the engine registering one source of a folder again must not undo it."""
    if name is not None and len(found.runs) != 1:
        raise ObserveError(
            f"{visible_line(str(found.root))}: --name names one run, but {len(found.runs)} were found here"
        )
    out = []
    for run in found.runs:
        done = Registered(run)
        try:
            main = register_source(
                store, run.main.path, follow=False, name=name, default_name=run.name, kind=run.main.kind
            )
        except ObserveError as exc:
            done.errors.append(str(exc))
            out.append(done)
            continue
        if pairing == "separate" and run.metrics is not None:
            set_joined(store, main, None)
        done.sources.append((main, run.main))
        if run.vocab_size is not None:
            set_vocab_fallback(store, main, run.vocab_size)
        for joined in run.joined:
            try:
                source_id = register_source(store, joined.path, follow=False, kind=joined.kind)
            except ObserveError as exc:
                done.errors.append(str(exc))
                continue
            set_joined(store, source_id, main, joined.external_id)
            if run.vocab_size is not None:
                set_vocab_fallback(store, source_id, run.vocab_size)
            done.sources.append((source_id, joined))
        attach = main if run.metrics is not None else None
        for rollout in run.rollouts:
            if rollout is run.main:
                continue
            try:
                source_id = register_source(
                    store, rollout.path, follow=False, kind=rollout.kind, attach_to=attach
                )
            except ObserveError as exc:
                done.errors.append(str(exc))
                continue
            done.sources.append((source_id, rollout))
        out.append(done)
    if follow:
        for _, source in import_order(out):
            register_source(store, source.path, follow=True, kind=source.kind)
    return out


def import_order(registered: list[Registered]) -> list[tuple[int, Found]]:
    """Every registered source once, in the order to import them: the sources that make runs, then those that
    join a run (it must exist first), then rollouts."""
    sources = list({source_id: (source_id, f) for r in registered for source_id, f in r.sources}.values())
    joining = {
        source_id
        for r in registered
        for source_id, f in r.sources
        if f in r.run.joined and f is not r.run.main
    }

    def rank(item: tuple[int, Found]) -> int:
        source_id, found = item
        return 2 if found.kind.startswith("rollouts-") else 1 if source_id in joining else 0

    return sorted(sources, key=rank)
