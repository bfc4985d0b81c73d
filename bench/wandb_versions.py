"""The cross-version check of W&B run files: a run written by the oldest and one by the newest wandb the
registry has, each read under either version's record protobufs (and the main environment's), with our framing
reader (engine/observe/wandb_log.py). Prints the matrix: writer x reader -> records read, of which not known
to the reader's protobufs (a newer writer's record types), damaged, the reward series and the tables found,
and whether every cell agrees on the data.

    python bench/wandb_versions.py                  # builds the venvs it lacks, writes, reads, prints
    python bench/wandb_versions.py --install-carl   # also: this checkout installed with its wandb extra in a
                                                    # venv of its own: which wandb pip leaves, and carl
                                                    # observe of the newest writer's run there

The venvs live under $CARL_WANDB_VENVS (default /work/venvs): wandb-0.19 and wandb-0.31 (python3.11 -m venv,
pip install wandb==V). tests/test_wandb_versions.py runs the same check where they exist. Each run is written
by tests/data/wandb/write_fixture.py (metrics, veRL's validation table, a completions table, console output).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENVS = Path(os.environ.get("CARL_WANDB_VENVS", "/work/venvs"))
VERSIONS = {"0.19.11": "wandb-0.19", "0.31.0": "wandb-0.31"}  # the oldest and the newest on the registry
WRITE = ROOT / "tests" / "data" / "wandb" / "write_fixture.py"

# Run inside a writer's venv: our framing reader loaded by its path (it needs the standard library alone),
# each record parsed by that venv's wandb.
READ = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("wandb_log", sys.argv[1])
log = sys.modules["wandb_log"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(log)
import google.protobuf, wandb
from google.protobuf import unknown_fields
from wandb.proto.wandb_internal_pb2 import Record
out = {"wandb": wandb.__version__, "protobuf": google.protobuf.__version__, "records": 0, "unknown": 0,
       "damaged": 0, "kinds": {}, "reward": {}, "tables": [], "console": ""}
path = sys.argv[2]
with open(path, "rb") as f:
    size = f.seek(0, 2)
    if log.header_problem(f.seek(0) or f.read(7)):
        raise SystemExit("header refused")
    for offset, item in log.RecordLog(f, size, 0):
        if not isinstance(item, (bytes, memoryview)):
            out["damaged"] += 1
            continue
        out["records"] += 1
        record = Record.FromString(item)
        kind = record.WhichOneof("record_type")
        if kind is None and len(unknown_fields.UnknownFieldSet(record)):
            out["unknown"] += 1
        out["kinds"][str(kind)] = out["kinds"].get(str(kind), 0) + 1
        if kind == "history":
            values = {"/".join(i.nested_key) or i.key: i.value_json for i in record.history.item}
            if "train/reward" in values:
                out["reward"][values["_step"]] = float(values["train/reward"])
            out["tables"] += [json.loads(v) for k, v in values.items() if k.endswith("/path")]
        elif kind == "output_raw":
            out["console"] += record.output_raw.line
print(json.dumps(out))
"""


def python_of(venv: str) -> Path:
    return VENVS / venv / "bin" / "python"


def have_venvs() -> bool:
    return all(python_of(venv).exists() for venv in VERSIONS.values())


def build_venvs() -> None:
    for version, venv in VERSIONS.items():
        if python_of(venv).exists():
            continue
        print(f"building {VENVS / venv} (wandb=={version})", flush=True)
        subprocess.run(["python3.11", "-m", "venv", str(VENVS / venv)], check=True)
        subprocess.run([str(python_of(venv)), "-m", "pip", "install", "-q", f"wandb=={version}"], check=True)


def write_run(version: str, folder: Path) -> Path:
    """A run written by `version`'s wandb into `folder`; its `.wandb` file."""
    subprocess.run(
        [str(python_of(VERSIONS[version])), str(WRITE), str(folder)],
        check=True,
        capture_output=True,
        cwd=folder.parent,  # never the repo: a stray `wandb/` folder there would shadow the package
    )
    [file] = folder.glob("wandb/offline-run-*/run-*.wandb")
    return file


def read_with(python: Path | str, file: Path) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), "-c", READ, str(ROOT / "engine" / "observe" / "wandb_log.py"), str(file)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=file.parent,  # `python -c` imports from its working directory first: never the repo's
    )
    return json.loads(done.stdout)


def matrix(tmp: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(writer, reader) -> what the reader read; readers: each version's venv and this environment
    ("main")."""
    readers: dict[str, Path | str] = {v: python_of(venv) for v, venv in VERSIONS.items()}
    readers["main"] = sys.executable
    cells = {}
    for writer in VERSIONS:
        file = write_run(writer, tmp / writer)
        for reader, python in readers.items():
            cells[writer, reader] = read_with(python, file)
    return cells


def agree(cells: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """What differs between readers of one writer's run, beyond what the readers' protobufs may not know."""
    problems = []
    for writer in VERSIONS:
        row = {reader: cell for (w, reader), cell in cells.items() if w == writer}
        first = next(iter(row.values()))
        for reader, cell in row.items():
            for field in ("records", "damaged", "reward", "tables", "console"):
                if cell[field] != first[field]:
                    problems.append(f"written by {writer}, read under {reader}: {field} differs")
            if cell["damaged"]:
                problems.append(f"written by {writer}, read under {reader}: {cell['damaged']} damaged")
    return problems


def install_carl(tmp: Path, run_file: Path) -> None:
    """This checkout with its wandb extra in a venv of its own: the wandb pip leaves, and carl observe
    there."""
    venv = VENVS / "carl-wandb"
    if not (venv / "bin" / "python").exists():
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{ROOT}[wandb]"],
        check=True,
        timeout=1800,
    )
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import wandb; print(wandb.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"pip install '.[wandb]' in {venv}: wandb {version} (no upper pin)")
    done = subprocess.run(
        [str(venv / "bin" / "carl"), "observe", str(run_file.parent)],
        capture_output=True,
        text=True,
        env={**os.environ, "CARL_HOME": str(tmp / "carl-home")},
        timeout=300,
    )
    print(f"carl observe (rc {done.returncode}):\n{done.stdout}{done.stderr}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--install-carl", action="store_true", help="also install this checkout in a venv")
    args = parser.parse_args()
    build_venvs()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cells = matrix(tmp)
        print(
            f"{'writer':>8} {'reader':>14} {'records':>8} {'unknown':>8} {'damaged':>8} {'rewards':>8} tables"
        )
        for (writer, _reader), cell in cells.items():
            under = f"{cell['wandb']}/pb{cell['protobuf']}"
            print(
                f"{writer:>8} {under:>14} {cell['records']:>8} {cell['unknown']:>8} {cell['damaged']:>8}"
                f" {len(cell['reward']):>8} {len(cell['tables'])}"
            )
        problems = agree(cells)
        print("every reader reads the same data" if not problems else "\n".join(problems))
        if args.install_carl:
            install_carl(tmp, next((tmp / "0.31.0").glob("wandb/offline-run-*/run-*.wandb")))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
