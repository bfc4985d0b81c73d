"""A zombie is not alive: a SIGKILLed engine or run that its parent has not reaped yet must read as dead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from engine.control.pidfile import pid_alive
from engine.processes import alive, is_zombie
from engine.training.artifacts import process_alive


def test_a_killed_child_not_yet_reaped_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert alive(child.pid, others_count=False) and pid_alive(child.pid) and process_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, and deliberately left unreaped
        os.kill(child.pid, 0)  # the zombie still answers the old probe...
        assert is_zombie(child.pid)
        assert not alive(child.pid, others_count=True)  # ...but not ours
        assert not pid_alive(child.pid) and not process_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid) and not is_zombie(child.pid)
