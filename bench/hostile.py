"""The hostile-input suite at length: 10,000 cases per parser family (issue 22 "Tests"), and the table.

    python bench/hostile.py                       # every family, 10,000 cases each, one after the other
    python bench/hostile.py --cases 500 --families jsonl-ours,trackio
    python bench/hostile.py --list                # the families
    python bench/hostile.py --write-seeds         # the binary seeds again, from the real writers

The families, their seeds, cases and oracle are the CI suite's (tests/hostile/): here each family runs in its
own process (a crash costs that family alone, and says so), randomized (`--seed` to repeat a run), counting
every case instead of stopping at the first refused one. Per family it prints: inputs, clean errors (one line
for the user), tracebacks (another exception, or one a catch-all swallowed), hangs, rows lost from the
baseline store, and the cases that printed a raw control byte; then the first few failures of each kind. Run
it at low priority on a shared machine: `nice -n 19 python bench/hostile.py`. Results: bench/out/hostile.json
(one line per family).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
OUT = ROOT / "bench" / "out"
COLUMNS = ("inputs", "errors", "tracebacks", "hangs", "lost", "leaks")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per family (default 10,000)")
    parser.add_argument("--families", default="", help="comma-separated names (default: all)")
    parser.add_argument(
        "--seed", type=int, default=None, help="hypothesis' seed (default: a new one per family)"
    )
    parser.add_argument(
        "--minutes", type=float, default=None, help="stop each family after this long, with the cases it ran"
    )
    parser.add_argument(
        "--total-minutes",
        type=float,
        default=None,
        help="share this much time among the families: each gets what is left over the families left",
    )
    parser.add_argument("--out", type=Path, default=OUT / "hostile.json")
    parser.add_argument("--list", action="store_true", help="list the families and stop")
    parser.add_argument("--write-seeds", action="store_true", help="write the binary seeds again and stop")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one family in this process (the children)
    args = parser.parse_args()

    if args.write_seeds:
        from hostile.seeds import SEEDS, write_seeds

        write_seeds()
        print(f"seeds written to {SEEDS}")
        return 0
    from hostile.families import FAMILIES

    if args.list:
        for name, family in FAMILIES.items():
            print(f"{name:20} CI cases: {family.ci_examples}")
        return 0
    if args.one:
        return run_one(args.one, args.cases, args.seed, args.out, args.minutes)
    names = [n for n in args.families.split(",") if n] or list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        parser.error(f"unknown families: {', '.join(unknown)} (see --list)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("")
    started = time.monotonic()
    for done_families, name in enumerate(names):
        child = [sys.executable, __file__, "--one", name, "--cases", str(args.cases), "--out", str(args.out)]
        if args.seed is not None:
            child += ["--seed", str(args.seed)]
        minutes = args.minutes
        if (
            args.total_minutes is not None
        ):  # a family that finishes early leaves its time to the ones after it
            left = args.total_minutes - (time.monotonic() - started) / 60
            minutes = max(left / (len(names) - done_families), 0.5)
        if minutes is not None:
            child += ["--minutes", f"{minutes:.2f}"]
        done = subprocess.run(child, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if done.returncode != 0 and not any(r["family"] == name for r in results(args.out)):
            with args.out.open("a") as f:
                f.write(json.dumps({"family": name, "crashed": done.returncode}) + "\n")
    print(
        f"\n{len(names)} families, {args.cases:,} cases each, "
        f"in {(time.monotonic() - started) / 60:.1f} min\n"
    )
    print(table(results(args.out)))
    return 0


def run_one(name: str, cases: int, seed: int | None, out: Path, minutes: float | None) -> int:
    import logging
    import random
    import shutil
    import tempfile

    from hostile.families import FAMILIES
    from hostile.oracle import Tally, scratch_root
    from hostile.runner import run_family

    # The engine's warnings about each bad input are counted by the oracle, not shown.
    logging.getLogger("carl").propagate = False
    seed = random.randrange(2**32) if seed is None else seed
    root = scratch_root(Path(tempfile.mkdtemp(prefix="carl-hostile-")))
    os.environ["CARL_HOME"] = str(root / "home")
    print(f"{name}: {cases:,} cases (seed {seed})", flush=True)

    shown = [0]

    def progress(tally: Tally) -> None:
        if tally.inputs // 1000 > shown[0]:
            shown[0] = tally.inputs // 1000
            print(f"  {name}: {line(vars(tally))} ({time.monotonic() - started:.0f}s)", flush=True)

    started = time.monotonic()
    try:
        family = FAMILIES[name]
        examples = -(-cases // family.inputs_per_case)  # a NATS case publishes several messages
        tally = run_family(
            family,
            root / name,
            examples=examples,
            strict=False,
            random_seed=seed,
            progress=progress,
            minutes=minutes,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    row = {k: v for k, v in vars(tally).items()} | {"seed": seed}
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"  {name}: {line(row)} in {tally.seconds:.0f}s", flush=True)
    for kind, examples in tally.examples.items():
        for example in examples[:2]:
            print(f"    {kind}: {example[-800:]}", flush=True)
    return 0


def results(path: Path) -> list[dict]:
    return (
        [json.loads(text) for text in path.read_text().splitlines() if text.strip()] if path.exists() else []
    )


def line(row: dict) -> str:
    return ", ".join(f"{k} {row.get(k, 0):,}" for k in COLUMNS)


def table(rows: list[dict]) -> str:
    head = (
        "| family | inputs | clean errors | tracebacks | hangs | rows lost | raw bytes printed | integrity"
        " | time |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for row in rows:
        if "crashed" in row:
            lines.append(f"| {row['family']} | crashed (exit {row['crashed']}) | | | | | | | |")
            continue
        cells = [
            f"{row[k]:,}" + (" (time cap)" if k == "inputs" and row.get("capped") else "") for k in COLUMNS
        ]
        lines.append(
            f"| {row['family']} | "
            + " | ".join(cells)
            + f" | {row['integrity']} | {row['seconds'] / 60:.1f} min |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
