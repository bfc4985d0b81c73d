"""The metrics explorer's reads (no Textual): every key of the runs shown, with each key's newest value
and its source's name, and the series of the keys in view, cached per (run, key) and extended with the rows
that arrive; a key of histograms is read whole (at most MAX_HEAT_ROWS of its steps) when its run moved. One
thread owns an `ExplorerFeed`; the screen asks it for the keys in view through a request queue and gets back
only what changed (Toolong's reader thread fed by a request queue, as the control room's StoreWatcher in
carl_tui/model.py)."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.store import RunRow, Series, StoreReader
from engine.store.histograms import HistogramSeries

from .explorer_model import KeyInfo, histogram_id, order_keys

Pair = tuple[int, str]  # (run id, key)
MAX_POINTS = 1024  # buckets a series is read at: more than a zoomed chart's dot columns at 160 wide
MAX_HEAT_ROWS = 512  # steps of a key of histograms read: a zoomed heat strip's lines, scrolled


@dataclass
class Listing:
    """The runs shown (in the order asked), the union of their keys (ordered by group), and each
    (run, key)'s newest value."""

    runs: list[RunRow]
    keys: list[KeyInfo]
    latest: dict[Pair, float | None] = field(default_factory=dict)
    histograms: dict[str, str] = field(default_factory=dict)  # explorer name -> stored key of histograms


@dataclass
class News:
    """One poll's news: the listing when the runs moved (None: unchanged), and the series that
    were read or grew."""

    listing: Listing | None = None
    series: dict[Pair, Series] = field(default_factory=dict)
    histograms: dict[Pair, HistogramSeries] = field(default_factory=dict)


def read_listing(reader: StoreReader, runs: Sequence[RunRow]) -> Listing:
    """Every key of the runs, one index seek per key (metric_keys, latest_values), and the names the
    sources gave the keys a framework's map renamed (the first run that renamed a key names it)."""
    keys: dict[str, str | None] = {}
    latest: dict[Pair, float | None] = {}
    stored: dict[str, None] = {}  # keys of histograms, in the order met
    for run in runs:
        run_keys = reader.metric_keys(run.id)
        names = reader.key_names(run.id)
        for key in run_keys:
            if keys.get(key) is None:
                keys[key] = names.get(key)
        for key, (_, value) in reader.latest_values(run.id, run_keys).items():
            latest[(run.id, key)] = value
        stored.update(dict.fromkeys(reader.histograms.keys(run.id)))
    histograms = {histogram_id(key, keys): key for key in stored}
    infos = [KeyInfo(key, source) for key, source in keys.items()]
    infos += [KeyInfo(name, histogram=key) for name, key in histograms.items()]
    return Listing(list(runs), order_keys(infos), latest, histograms)


def read_histograms(
    reader: StoreReader,
    pairs: Iterable[Pair],
    names: dict[str, str],
    cache: dict[Pair, HistogramSeries],
    stale: set[Pair],
) -> dict[Pair, HistogramSeries]:
    """The histograms of `pairs` (run, explorer name) not cached or stale, read again whole; `names` gives
    each name's stored key. Returns those read; `cache` and `stale` are updated."""
    changed: dict[Pair, HistogramSeries] = {}
    for pair in pairs:
        if pair in cache and pair not in stale:
            continue
        run_id, name = pair
        cache[pair] = changed[pair] = reader.histograms.series(run_id, names[name], max_steps=MAX_HEAT_ROWS)
        stale.discard(pair)
    return changed


def read_series(
    reader: StoreReader, pairs: Iterable[Pair], cache: dict[Pair, Series], stale: set[Pair]
) -> dict[Pair, Series]:
    """The series of `pairs` that are not cached, or are stale (their run moved): read, or extended
    with the rows past the cached ones. Returns those that changed; `cache` and `stale` are updated."""
    changed: dict[Pair, Series] = {}
    for pair in pairs:
        old = cache.get(pair)
        if old is not None and pair not in stale:
            continue
        run_id, key = pair
        if old is None:
            new = reader.series(run_id, key, max_points=MAX_POINTS)
        else:
            new = reader.extend_series(run_id, key, old, max_points=MAX_POINTS)
        stale.discard(pair)
        if new is not old:
            cache[pair] = changed[pair] = new
    return changed


class ExplorerFeed:
    """Follows the store for the explorer, on one thread. Any thread may call `want` (the keys in
    view, read at the next poll); `poll` and `wait` belong to the thread that reads."""

    def __init__(
        self,
        db_path: Path,
        run_ids: Sequence[int],
        *,
        first: Callable[[list[KeyInfo]], list[str]] | None = None,
    ) -> None:
        self.db_path = db_path
        self.run_ids = list(run_ids)
        # the keys of the first screen, from the first listing: read with it, in the same poll
        self.first = first
        self.requests: queue.SimpleQueue[tuple[Pair, ...]] = queue.SimpleQueue()
        self.reader: StoreReader | None = None
        self.version = -1
        self.runs: dict[int, RunRow] = {}
        self.wanted: tuple[Pair, ...] = ()
        self.cache: dict[Pair, Series] = {}
        self.stale: set[Pair] = set()
        self.histogram_names: dict[str, str] = {}  # explorer name -> stored key, from the listing
        self.heat_cache: dict[Pair, HistogramSeries] = {}
        self.heat_stale: set[Pair] = set()

    def want(self, pairs: Iterable[Pair]) -> None:
        """Read these (run, key) series (the keys in view), and keep them up to date."""
        self.requests.put(tuple(pairs))

    def wait(self, timeout: float) -> None:
        """Block until a request arrives or `timeout` seconds pass (the poll period)."""
        with contextlib.suppress(queue.Empty):
            self.wanted = self.requests.get(timeout=max(timeout, 0.0))

    def _drain(self) -> None:
        while True:
            try:
                self.wanted = self.requests.get_nowait()
            except queue.Empty:
                return

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def poll(self) -> News | None:
        """What changed since the last poll: the listing when a run moved, the wanted series that were
        read or grew; None when nothing did. Raises StoreError when the store cannot be read."""
        self._drain()
        if self.reader is None:
            if not self.db_path.exists():
                return None
            self.reader = StoreReader(self.db_path)
        reader = self.reader
        news = News()
        version = reader.data_version()
        if version != self.version:
            self.version = version
            news.listing = self._relist(reader)
        wanted = self.wanted
        if news.listing is not None and self.first is not None and not wanted:
            keys = self.first(news.listing.keys)
            wanted = tuple((run_id, key) for key in keys for run_id in self.run_ids)
            self.first = None
        names = self.histogram_names
        heat = [pair for pair in wanted if pair[1] in names]
        news.series = read_series(
            reader, [pair for pair in wanted if pair[1] not in names], self.cache, self.stale
        )
        news.histograms = read_histograms(reader, heat, names, self.heat_cache, self.heat_stale)
        return news if news.listing is not None or news.series or news.histograms else None

    def _relist(self, reader: StoreReader) -> Listing | None:
        """The listing again when a run's row moved (its last step, its status); the cached series of
        a run that moved are stale, and those of a run that went back (a resume) are dropped."""
        runs = [run for run in (reader.run(run_id) for run_id in self.run_ids) if run is not None]
        moved = [run for run in runs if self.runs.get(run.id) != run]
        if not moved and len(runs) == len(self.runs):
            return None
        for run in moved:
            before = self.runs.get(run.id)
            went_back = before is not None and (run.last_step or 0) < (before.last_step or 0)
            for pair in [pair for pair in self.cache if pair[0] == run.id]:
                if went_back:
                    del self.cache[pair]
                else:
                    self.stale.add(pair)
            self.heat_stale.update(pair for pair in self.heat_cache if pair[0] == run.id)
        self.runs = {run.id: run for run in runs}
        listing = read_listing(reader, runs)
        self.histogram_names = listing.histograms
        return listing
