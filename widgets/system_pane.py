"""The System pane: the machines a run trains on, in a few lines, redrawn line by line.

Per GPU its utilisation and memory as bars, its power and temperature; then CPU, RAM and the free space of the
run's disk (or $CARL_HOME's), the run's throughput where it logs `perf/*` metrics, and its processes. Without
an NVIDIA GPU the sample's note says so in one line (`no NVIDIA GPU: NVML not found ...`). A node that is
lost, stopped, or has sent nothing for a while says so in one line instead of showing old numbers. Several
nodes: one summary line each, or a block each when the pane is maximized (`5`).

What it draws is a list of lines, worked out from the data and the width (`box_lines`, no Textual). The widget
keeps the lines it drew and, given new data, hands Textual only the lines that differ (`refresh(Region)`), so
a sample that moves one number sends that one line to the terminal (bench/bench_system_pane.py). It never
reads the store: the app hands it a `BoxData` from the watcher's snapshot. Every string from a node (its name,
a GPU's name, a note, an NVML error) is text, never markup, with its control characters made visible.
"""

from __future__ import annotations

import math
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from engine.text import visible_line

QUIET_INTERVALS = 3  # a node that sent nothing for this many of its intervals is said to be quiet ...
QUIET_MIN_S = 10.0  # ... and never before this many seconds (one late sample on a busy box is not news)
DEFAULT_INTERVAL_S = (
    2.0  # engine/system/system_settings.py's default, until a node's second sample tells its own
)
WIDE = 56  # from this many columns a GPU is one line with both bars; below, two lines (or one, compact)
MEMORY_WARN, MEMORY_HIGH = 0.90, 0.98  # GPU or RAM memory in use: 98% is the gpu_memory health rule's
DISK_LOW_FRACTION, DISK_LOW_BYTES = 0.05, 2 * 2**30  # the disk_full rule's thresholds (issue 28 §6)
HOT_C = 85.0  # a GPU this hot is near where most boards start to slow down
BAR_MAX = 30  # a bar wider than this reads no better
VALUE_W = 8  # the column a meter's value is right-aligned in: "75G free", "0.5/24G", " 87% 71°C"
MAX_NOTES = 2  # notes of a node shown (the maximized pane shows them all)
NOTHING_YET = "nothing sampled yet: the engine samples this machine every 2 s ([system] in engine.toml)"
BLOCKS = " ▏▎▍▌▋▊▉█"  # eighths of a cell
STATE_MARKS = {"live": "●", "lost": "✕", "stopped": "○", "quiet": "◌"}

Part = tuple[str, str]  # text and its role: "" plain, or one of ROLES (the widget styles each)
ROLES = ("label", "bar", "bar-warn", "bar-error", "track", "note", "error", "ok", "warn")


@dataclass(frozen=True)
class BoxData:
    """What the pane draws: the nodes (rows of `nodes`), each node's newest whole sample by node id
    (engine/system/readings.py `Sample.to_json()`), each node's sampling interval, and of the selected run its
    directory, its newest throughput metrics (`perf/*`) and its processes; the engine's state and
    $CARL_HOME."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    samples: Mapping[int, dict[str, Any]] = field(default_factory=dict)
    intervals: Mapping[int, float | None] = field(default_factory=dict)
    run_dir: str | None = None
    home: str | None = None
    perf: Mapping[str, float] = field(default_factory=dict)
    processes: list[dict[str, Any]] = field(default_factory=list)
    engine: str = "up"


# -- numbers as short text -----------------------------------------------------------------------------------


def node_id(node: Mapping[str, Any]) -> int:
    """A node row's id: the key of its samples and of its interval (0, which no row has, when it has none)."""
    value = node.get("id")
    return value if isinstance(value, int) else 0


def number(data: Mapping[str, Any], key: str) -> float | None:
    """A finite number of a sample (a node's JSON is checked where it enters, and read as if it were not)."""
    value = data.get(key) if isinstance(data, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def size(value: float | None) -> str:
    """Bytes in four characters or so, in powers of 1024: 512M, 7.5G, 71G, 1.2T."""
    if value is None:
        return "—"
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if value >= scale:
            amount = value / scale
            return f"{amount:.1f}{unit}" if amount < 10 else f"{amount:.0f}{unit}"
    return f"{value:.0f}B"


def pair(used: float | None, total: float | None) -> str:
    """used/total in the total's unit: 12/31G, 0.5/7.7G."""
    if used is None or not total:
        return size(used)
    text = size(total)
    unit = text[-1]
    scale = {"T": 2**40, "G": 2**30, "M": 2**20, "K": 2**10}.get(unit, 1)
    amount = used / scale
    return f"{amount:.1f}/{text}" if amount < 10 else f"{amount:.0f}/{text}"


def rate(value: float | None) -> str:
    """A count per second: 950, 2.3k, 41k, 1.2M."""
    if value is None:
        return "—"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            amount = value / scale
            return f"{amount:.1f}{unit}" if amount < 10 else f"{amount:.0f}{unit}"
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def percent(value: float | None) -> str:
    return " —%" if value is None else f"{min(value, 999):3.0f}%"


def clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "--:--:--"


def bar(fraction: float | None, width: int) -> str:
    """`width` cells filled to `fraction` in eighths of a cell."""
    if width <= 0:
        return ""
    eighths = round(max(0.0, min(1.0, fraction or 0.0)) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (BLOCKS[part] if part else ""))[:width].ljust(width)


def bar_parts(fraction: float | None, width: int, role: str = "bar") -> list[Part]:
    """A bar as its filled cells (in `role`) and its empty track."""
    cells = bar(fraction, width)
    filled = cells.rstrip(" ")
    return [(filled, role), (" " * (width - len(filled)), "track")]


def level(fraction: float | None, warn: float, high: float) -> str:
    if fraction is None or fraction < warn:
        return "bar"
    return "bar-warn" if fraction < high else "bar-error"


def width_of(parts: list[Part]) -> int:
    return sum(len(text) for text, _ in parts)


def meter(
    label: str, fraction: float | None, value: str, width: int, role: str = "bar", value_width: int = VALUE_W
) -> list[Part]:
    """`label ▕bar▏ value`: the value right-aligned in `value_width` columns, so the bars of a block line up;
    the bar takes what is left, up to BAR_MAX (none below 3 cells)."""
    value = value.rjust(value_width)
    room = width - len(label) - 1 - len(value)
    parts: list[Part] = [(label, "label")]
    if room >= 3:
        parts += bar_parts(fraction, min(room, BAR_MAX), role)
    return [*parts, (" " + value, "")]


def fit(parts: list[Part], extras: list[list[Part]], width: int) -> list[Part]:
    """`parts` and then as many of `extras` as fit, in order."""
    out = list(parts)
    for extra in extras:
        if width_of(out) + width_of(extra) <= width:
            out += extra
    return out


# -- the lines of a node -------------------------------------------------------------------------------------


def gpu_lines(gpu: Mapping[str, Any], width: int, *, compact: bool, wide: bool) -> list[list[Part]]:
    """One GPU: one line from WIDE columns (or when compact), else two: utilisation, then memory."""
    index = gpu.get("index")
    label = f"gpu{index} " if isinstance(index, int) else "gpu? "
    error = gpu.get("error")
    if isinstance(error, str) and error:
        return [[(label, "label"), ("lost: " + visible_line(error), "error")]]
    util = number(gpu, "util")
    used, total = number(gpu, "mem_used"), number(gpu, "mem_total")
    memory = used / total if used is not None and total else None
    memory_role = level(memory, MEMORY_WARN, MEMORY_HIGH)
    temp, power = number(gpu, "temp_c"), number(gpu, "power_w")
    temp_part: list[Part] = [(f" {temp:.0f}°C", "warn" if temp >= HOT_C else "")] if temp is not None else []
    limit = number(gpu, "power_limit_w")
    watts = f" {power:.0f}/{limit:.0f}W" if power is not None and limit and wide else None
    power_part: list[Part] = [(watts or f" {power:.0f}W", "")] if power is not None else []
    warnings: list[Part] = []
    xid = gpu.get("xid")
    if isinstance(xid, int) and not isinstance(xid, bool) and xid > 0:
        last = gpu.get("last_xid")
        warnings.append((f" XID {last}" if isinstance(last, int) else f" {xid} XID", "error"))
    reasons = gpu.get("throttle_reasons")
    if isinstance(reasons, list) and reasons and isinstance(reasons[0], str):
        warnings.append((" ⚠ " + visible_line(reasons[0]), "warn"))
    name = gpu.get("name")
    name_part: list[Part] = [(" " + visible_line(name), "label")] if isinstance(name, str) and name else []
    memory_text = " " + pair(used, total)
    if compact:
        parts: list[Part] = [(label, "label"), (percent(util).lstrip(), ""), (memory_text, "")]
        return [fit(parts, [temp_part, power_part, warnings], width)]
    if width >= WIDE:
        fixed = len(label) + 5 + len(memory_text) + 1
        room = max(0, (width - fixed - width_of(temp_part) - width_of(power_part)) // 2 - 1)
        cells = min(room, BAR_MAX)
        parts = [(label, "label"), *bar_parts(util / 100 if util is not None else None, cells)]
        parts.append((" " + percent(util), ""))
        parts += [(" ", ""), *bar_parts(memory, cells, memory_role), (memory_text, memory_role)]
        return [fit(parts, [power_part, temp_part, warnings, name_part], width)]
    fraction = util / 100 if util is not None else None
    first = fit(
        meter(label, fraction, percent(util) + "".join(t for t, _ in temp_part), width), [warnings], width
    )
    second = meter(" " * len(label), memory, pair(used, total), width, memory_role)
    return [first, fit(second, [power_part], width)]


def node_lines(
    node: Mapping[str, Any],
    sample: Mapping[str, Any] | None,
    data: BoxData,
    width: int,
    now: float,
    *,
    detail: str,
    wide: bool,
) -> list[list[Part]]:
    """A node's block: its state in one line when it is not sampling, else its GPUs (or the note that there
    are none), CPU, RAM and the run's disk. `detail`: "full" (a GPU in two lines when narrow), "compact" (a
    GPU a line) or "summary" (all its GPUs in two lines)."""
    quiet = quiet_line(node, sample, data, now, named=len(data.nodes) > 1)
    if quiet is not None:
        return wrapped(quiet, width)
    assert sample is not None
    lines: list[list[Part]] = []
    gpus = [g for g in sample.get("gpus") or [] if isinstance(g, Mapping)]
    if detail == "summary" and len(gpus) > 1:
        lines += gpus_summary(gpus, width)
    else:
        for gpu in gpus:
            lines += gpu_lines(gpu, width, compact=detail != "full", wide=wide)
    notes = [n for n in sample.get("notes") or [] if isinstance(n, str)]
    for note in notes if wide else notes[:MAX_NOTES]:
        lines.append([(short_note(visible_line(note), width), "note")])
    lines.append(cpu_line(sample, width, wide=wide))
    lines.append(ram_line(sample, width, wide=wide))
    disk = pick_disk(sample.get("disks"), data.run_dir, data.home)
    if disk is not None:
        lines.append(disk_line(disk, width, wide=wide))
    if wide:
        recv, sent = number(sample, "net_recv"), number(sample, "net_sent")
        if recv is not None or sent is not None:
            lines.append([("net  ", "label"), (f"↓ {size(recv)}/s  ↑ {size(sent)}/s", "")])
    return lines


def gpus_summary(gpus: list[Mapping[str, Any]], width: int) -> list[list[Part]]:
    """Every GPU of a node in two lines: their mean utilisation, and their memory together with the fullest
    one's share (what the gpu_memory rule looks at)."""
    utils = [u for g in gpus if (u := number(g, "util")) is not None]
    mean = sum(utils) / len(utils) if utils else None
    label = f"gpu×{len(gpus)} "
    first = meter(label, mean / 100 if mean is not None else None, f"avg{percent(mean)}", width)
    used = [number(g, "mem_used") or 0.0 for g in gpus]
    total = [number(g, "mem_total") or 0.0 for g in gpus]
    fullest = max((u / t for u, t in zip(used, total, strict=True) if t), default=None)
    role = level(fullest, MEMORY_WARN, MEMORY_HIGH)
    second = meter(
        " " * len(label), fullest, f"max{percent(None if fullest is None else 100 * fullest)}", width, role
    )
    lost = sum(1 for g in gpus if isinstance(g.get("error"), str))
    return [first, second] + ([[(f"{lost} gpu lost (5 shows which)", "error")]] if lost else [])


def short_note(note: str, width: int) -> str:
    """A note that does not fit says what comes before its reason: `no NVIDIA GPU` (the pane maximized, or the
    System screen's heading, gives the whole of it)."""
    head = note.split(": ", 1)[0]
    return head if len(note) > width and len(head) <= width else note


def cpu_line(sample: Mapping[str, Any], width: int, *, wide: bool) -> list[Part]:
    cpu = number(sample, "cpu")
    cores = [c for c in sample.get("cores") or [] if isinstance(c, int | float)]
    load = [x for x in sample.get("load") or [] if isinstance(x, int | float)]
    extras: list[list[Part]] = []
    if load:
        extras.append([(f" load {load[0]:.1f}", "label")])
    if cores and wide:
        extras.append([(f" {len(cores)} cores, busiest {max(cores):.0f}%", "label")])
    value = percent(cpu)
    extra_width = width_of(extras[0]) if extras and width >= 30 else 0
    parts = meter("cpu  ", cpu / 100 if cpu is not None else None, value, width - extra_width)
    return fit(parts, extras, width)


def ram_line(sample: Mapping[str, Any], width: int, *, wide: bool) -> list[Part]:
    used, total = number(sample, "mem_used"), number(sample, "mem_total")
    fraction = used / total if used is not None and total else None
    swap = number(sample, "swap_used")
    extras = [[(f" swap {size(swap)}", "label")]] if swap and wide else []
    role = level(fraction, MEMORY_WARN, MEMORY_HIGH)
    return fit(meter("ram  ", fraction, pair(used, total), width, role), extras, width)


def disk_line(disk: Mapping[str, Any], width: int, *, wide: bool) -> list[Part]:
    total, free = number(disk, "total"), number(disk, "free")
    used = 1 - free / total if free is not None and total else None
    low = free is not None and (free < DISK_LOW_BYTES or (total and free / total < DISK_LOW_FRACTION))
    value = f"{size(free)} free"
    mount = disk.get("mount")
    label = "disk "
    parts = meter(label, used, value, width, "bar-error" if low else "bar")
    if low:
        parts[-1] = (parts[-1][0], "error")
    extras = (
        [[(f" of {size(total)} on {visible_line(mount)}", "label")]]
        if wide and isinstance(mount, str)
        else []
    )
    return fit(parts, extras, width)


def pick_disk(disks: Any, run_dir: str | None, home: str | None) -> Mapping[str, Any] | None:
    """The disk the run writes on (the longest mount point its directory is under), else $CARL_HOME's, else
    the first sampled."""
    if not isinstance(disks, list):
        return None
    found = [d for d in disks if isinstance(d, Mapping) and isinstance(d.get("mount"), str)]
    for path in (run_dir, home):
        if not path:
            continue
        under = [d for d in found if _under(path, d["mount"])]
        if under:
            return max(under, key=lambda d: len(d["mount"]))
    return found[0] if found else None


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def quiet_line(
    node: Mapping[str, Any],
    sample: Mapping[str, Any] | None,
    data: BoxData,
    now: float,
    *,
    named: bool = True,
) -> Part | None:
    """What to say of a node that is not sampling now (lost, stopped, or silent for QUIET_INTERVALS of its
    interval); None while it samples. `named`: the line names the node (the pane's title names a lone one)."""
    name = visible_line(str(node.get("name") or "?")) + " " if named else ""
    state = node.get("state")
    note = node.get("note")
    why = f": {visible_line(note)}" if isinstance(note, str) and note and state != "live" else ""
    last = number(sample, "t") if sample else None
    if state == "lost":
        lost_at = node.get("lost_at")
        when = clock(lost_at) if isinstance(lost_at, int | float) else clock(last)
        return (f"{STATE_MARKS['lost']} {name}lost at {when}{why}", "error")
    if state == "stopped":
        since = f" · last sample {clock(last)}" if last is not None else ""
        return (f"{STATE_MARKS['stopped']} {name}stopped{why}{since}", "warn")
    if last is None:
        return (f"{STATE_MARKS['quiet']} {name}no sample yet", "warn")
    interval = data.intervals.get(node_id(node)) or DEFAULT_INTERVAL_S
    if now - last <= max(QUIET_INTERVALS * interval, QUIET_MIN_S):
        return None
    # The engine marks the machine stopped when sampling is off (engine/system/system_job.py): silent with the
    # engine up is an engine that does not get to its sampling, which the engine's log says more of.
    why = " · engine down" if node.get("via") == "local" and data.engine in ("down", "stopped") else ""
    return (f"{STATE_MARKS['quiet']} {name}no sample since {clock(last)}{why}", "warn")


def wrapped(part: Part, width: int, most: int = 3) -> list[list[Part]]:
    """A sentence on as many lines as it needs at this width (at most `most`; the last is cut)."""
    text, role = part
    lines = textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]
    if len(lines) > most:
        lines = [*lines[: most - 1], " ".join(lines[most - 1 :])]
    return [[(line, role)] for line in lines]


def summary_line(
    node: Mapping[str, Any], sample: Mapping[str, Any] | None, data: BoxData, now: float
) -> list[Part]:
    """A node in one line: `● name gpu 87% cpu 37% ram 40%` (several nodes in a small pane)."""
    quiet = quiet_line(node, sample, data, now)
    if quiet is not None:
        return [quiet]
    assert sample is not None
    parts: list[Part] = [(f"{STATE_MARKS['live']} ", "ok"), (visible_line(str(node.get("name") or "?")), "")]
    gpus = [g for g in sample.get("gpus") or [] if isinstance(g, Mapping)]
    utils = [u for g in gpus if (u := number(g, "util")) is not None]
    if utils:
        parts.append((f" gpu {percent(sum(utils) / len(utils)).strip()}", ""))
    parts.append((f" cpu {percent(number(sample, 'cpu')).strip()}", ""))
    used, total = number(sample, "mem_used"), number(sample, "mem_total")
    if used is not None and total:
        parts.append((f" ram {percent(100 * used / total).strip()}", ""))
    return parts


def run_lines(data: BoxData, width: int) -> list[list[Part]]:
    """The selected run's throughput (where it logs `perf/*`) and its processes, a line each."""
    lines: list[list[Part]] = []
    perf = data.perf
    pieces: list[str] = []
    if "perf/tokens_per_s" in perf:
        per_gpu = perf.get("perf/tokens_per_s_per_gpu")
        pieces.append(
            f"{rate(perf['perf/tokens_per_s'])} tok/s" + (f" ({rate(per_gpu)}/gpu)" if per_gpu else "")
        )
    if "perf/mfu" in perf:
        pieces.append(f"MFU {100 * perf['perf/mfu']:.0f}%")
    if "perf/samples_per_s" in perf:
        pieces.append(f"{rate(perf['perf/samples_per_s'])} samples/s")
    if "perf/step_time_s" in perf:
        pieces.append(f"{perf['perf/step_time_s']:.2f} s/step")
    if pieces:
        gap = " · " if width >= 40 else " "
        head: list[Part] = [("run  ", "label"), (pieces[0], "")]
        lines.append(fit(head, [[(gap + piece, "")] for piece in pieces[1:]], width))
    if data.processes:
        live = [p for p in data.processes if p.get("ended_at") is None]
        ended = len(data.processes) - len(live)
        rss = sum(p["rss"] for p in live if isinstance(p.get("rss"), int))
        cpu = sum(p["cpu"] for p in live if isinstance(p.get("cpu"), int | float))
        parts: list[Part] = [("proc ", "label"), (f"{len(live)} live", "")]
        extras: list[list[Part]] = [[(f" · cpu {cpu:.0f}%", "")], [(f" · rss {size(rss)}", "")]]
        if ended:
            extras.insert(0, [(f" · {ended} ended", "warn")])
        lines.append(fit(parts, extras, width))
    return lines


def box_lines(
    data: BoxData, width: int, max_lines: int, *, wide: bool = False, now: float | None = None
) -> list[list[Part]]:
    """Everything the pane shows at this width, in at most `max_lines` lines: the most detail that fits (a GPU
    in two lines, then in one, then all of a node's GPUs in two), several nodes as a line each unless `wide`
    (the pane maximized); what still does not fit is cut, and the last line says how much."""
    now = time.time() if now is None else now
    width = max(width, 8)
    if not data.nodes:
        why = "engine down: nothing sampled" if data.engine in ("down", "stopped") else NOTHING_YET
        return [*wrapped((why, "note"), width), *run_lines(data, width)][:max_lines]
    several = len(data.nodes) > 1
    for detail in ("full", "compact", "summary"):
        lines: list[list[Part]] = []
        for node in data.nodes:
            sample = data.samples.get(node_id(node))
            if several and not wide:
                lines.append(summary_line(node, sample, data, now))
                continue
            if several and quiet_line(node, sample, data, now) is None:
                lines.append(
                    [(f"{STATE_MARKS['live']} ", "ok"), (visible_line(str(node.get("name") or "?")), "")]
                )
            lines += node_lines(node, sample, data, width, now, detail=detail, wide=wide)
        lines += run_lines(data, width)
        if len(lines) <= max_lines:
            return lines
    if max_lines < 1:
        return []
    hidden = len(lines) - max_lines + 1
    return [*lines[: max_lines - 1], [(f"+{hidden} more lines · 5 shows them", "label")]]


# -- the widget ----------------------------------------------------------------------------------------------


class SystemPane(Widget):
    """The pane. `show(data)` replaces what it draws; only the lines that changed are refreshed. `max_lines`
    bounds its height (the app sets it from the screen's); `wide` (maximized) shows each node in full."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"system-pane--{role}" for role in ROLES}
    TICK_S = 2.0  # how often the pane looks whether a node went quiet (nothing else moves it)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.data = BoxData()
        self.max_lines = 8
        self.wide = False
        self.clock: Callable[[], float] = time.time
        self.lines: list[list[Part]] = []  # what is drawn, as parts
        self._strips: dict[int, Strip] = {}
        self.refreshed: list[int] = []  # the lines handed to Textual at the last change (tests read it)
        self.rendered: Counter[int] = Counter()  # lines Textual asked for, by line, since last cleared

    def on_mount(self) -> None:
        self.set_interval(self.TICK_S, self.redraw)

    def show(self, data: BoxData) -> None:
        """New data: redraw what changed."""
        if data != self.data:
            self.data = data
            self.redraw()

    def set_size(self, max_lines: int, wide: bool) -> None:
        if (max_lines, wide) != (self.max_lines, self.wide):
            self.max_lines, self.wide = max_lines, wide
            self.redraw()

    def on_resize(self) -> None:
        self._strips.clear()
        self.redraw(whole=True)

    def notify_style_update(self) -> None:
        # Styles were applied again (a theme change): the cached lines have the old colours.
        super().notify_style_update()
        self._strips.clear()

    def redraw(self, *, whole: bool = False) -> None:
        """Work out the lines and refresh those that differ from what is drawn."""
        width = self.content_size.width or 40
        lines = box_lines(self.data, width, self.max_lines, wide=self.wide, now=self.clock())
        if len(lines) != len(self.lines) or whole:
            self.lines = lines
            self._strips.clear()
            self.refreshed = list(range(len(lines)))
            self.refresh(layout=True)  # its height follows its lines
            return
        changed = [y for y, line in enumerate(lines) if line != self.lines[y]]
        self.lines = lines
        self.refreshed = changed
        for y in changed:
            self._strips.pop(y, None)
            self.refresh(Region(0, y, self.content_size.width, 1))

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return max(1, len(self.lines))

    def text(self) -> str:
        """What the pane shows, as plain text (tests, tmux)."""
        return "\n".join("".join(t for t, _ in line) for line in self.lines)

    def render_line(self, y: int) -> Strip:
        self.rendered[y] += 1
        width = self.content_size.width
        strip = self._strips.get(y)
        if strip is None or strip.cell_length != width:
            strip = self._strip(self.lines[y] if y < len(self.lines) else [], width)
            self._strips[y] = strip
        return strip

    def _strip(self, parts: list[Part], width: int) -> Strip:
        base = self.rich_style
        styles: dict[str, Style] = {"": base}
        segments = []
        for text, role in parts:
            if role not in styles:
                styles[role] = base + self.get_component_rich_style(f"system-pane--{role}")
            segments.append(Segment(text, styles[role]))
        line = Text.assemble(*((s.text, s.style or "") for s in segments), no_wrap=True, end="")
        line.truncate(width, overflow="ellipsis", pad=True)
        return Strip(list(line.render(self.app.console)), width).crop_extend(0, width, base)
