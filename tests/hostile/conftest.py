"""The hostile suite's fixtures: a scratch folder per family (in memory when /dev/shm has room), and CARL_HOME
restored after the `carl` commands a family runs in this process have set it."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hostile.families import AWAITING_VISIBLE
from hostile.oracle import Tally, scratch_root
from hostile.runner import Family, run_family


@pytest.fixture
def run_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Family], Tally]]:
    """Run a family as CI does: its CI number of cases, derandomized, strict (the first refused case fails,
    shrunk by hypothesis); a raw control byte printed is an xfail for the families that await visible()
    (families.py)."""
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = scratch_root(tmp_path / "scratch")

    def run(family: Family) -> Tally:
        awaiting = family.name in AWAITING_VISIBLE
        tally = run_family(
            family, root / family.name, examples=family.ci_examples, strict=True, leaks_fail=not awaiting
        )
        if tally.leaks and awaiting:
            first = tally.examples.get("leak", [""])[0]
            pytest.xfail(
                f"{tally.leaks} of {tally.inputs} cases printed a raw control byte (r22-terminal): {first}"
            )
        return tally

    yield run
    shutil.rmtree(root, ignore_errors=True)
