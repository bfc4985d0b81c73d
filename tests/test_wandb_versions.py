"""W&B run files across wandb versions: a run written by the oldest (0.19.11) and one by the newest (0.31.0)
wandb the registry has, each in a venv of its own, read with our framing reader under either version's
protobufs and this environment's (bench/wandb_versions.py prints the same matrix and builds the venvs). CI has
the main venv only: there this test skips, and tests/test_wandb_log.py reads the committed fixtures both
versions wrote."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine.observe import observe
from engine.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import wandb_versions  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not wandb_versions.have_venvs(),
        reason=f"no wandb 0.19 and 0.31 venvs under {wandb_versions.VENVS}: bench/wandb_versions.py builds"
        " them",
    ),
]


def test_each_writer_is_read_the_same_under_each_readers_protobufs(tmp_path: Path) -> None:
    cells = wandb_versions.matrix(tmp_path)
    assert wandb_versions.agree(cells) == []
    for (writer, _), cell in cells.items():
        assert cell["damaged"] == 0 and cell["records"] > 50, (writer, cell)
        assert cell["reward"] == {str(step): step / 12 for step in range(1, 13)}
        assert len(cell["tables"]) == 4 and "step 12: reward 1.000" in cell["console"]
    with Store(tmp_path / "carl.db") as store:  # and the whole reader, here, on both
        for writer in wandb_versions.VERSIONS:
            [run_dir] = (tmp_path / writer).glob("wandb/offline-run-*")
            _, result = observe(store, run_dir)
            assert result.bad_lines == 0 and len(result.run_ids) == 1, (writer, result.problems)
            samples = store.conn.execute(
                "SELECT count(*) FROM rollouts WHERE run_id=?", (result.run_ids[0],)
            ).fetchone()[0]
            assert samples == 3 * 3 + 2, writer  # veRL's table at steps 4, 8, 12; the completions table
