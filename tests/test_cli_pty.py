"""`carl` on a real terminal (a pty), where it draws what it never draws into a pipe: the progress bar of a
long import, in colour (issue 30 §4: a directory named `x[/bold]y` raised MarkupError with a traceback once
the bar was drawn, and the suite, reading through pipes, never drew it)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def on_a_pty(argv: list[str], env: dict[str, str], timeout: float = 180.0) -> tuple[int, str]:
    """Run `argv` with a pty as its terminal (stdin, stdout and stderr); its exit code and all it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, close_fds=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise AssertionError(
                f"still running after {timeout:.0f} s: {out[-2000:].decode(errors='replace')}"
            )
    finally:
        os.close(master)
        proc.wait(timeout=30)
    return proc.returncode, out.decode("utf-8", "replace")


@pytest.mark.slow
def test_a_long_import_draws_its_progress_bar_on_a_terminal_whatever_the_folder_is_named(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    folder = root / "x[/bold]y [red]z\x1b[2J"  # the bar's label names the file under the folder observed
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:  # enough rows that the import outlasts the bar's delay
        for step in range(150_000):
            f.write(f'{{"step": {step}, "loss": {1 / (step + 1)}, "reward": {step % 7 / 7}}}\n')
    env = {**os.environ, "CARL_HOME": str(tmp_path / "home"), "TERM": "xterm-256color", "COLUMNS": "100"}
    code, out = on_a_pty([sys.executable, "-m", "engine.cli", "observe", str(root)], env)
    assert code == 0, out
    assert "Traceback" not in out and "MarkupError" not in out
    assert "importing " in out and "x[/bold]y" in out  # the bar was drawn, its label as text
    assert "\x1b[2J" not in out.replace("\\x1b[2J", "")  # the name's escape shown as text, never obeyed
