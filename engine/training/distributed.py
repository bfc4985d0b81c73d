"""Data-parallel training: `carl train --processes N` runs N ranks through accelerate's launcher.

The `carl train` you start opens the run (or reopens it for `--resume`), then starts
`accelerate launch --multi_gpu --num_processes N -m engine.training --attach RUN` (torchrun under
it: gloo on CPU, NCCL on GPUs) and waits. `accelerate launch ... -m engine.training --config
carl.yaml` started by hand (several machines) gets the same ranks; rank 0 then opens the run itself.
TRL's trainers already run data-parallel and gather the rewards for the advantages. What carl adds:

- Rank 0 alone writes to the store; the other ranks get a `Reporter` without one.
- The per-step Phi statistics and the samples pool every rank's completions (one all_gather at the
  step's end), so the step's token count is the global batch's.
- The cascade gate reads the task reward TRL gathered over every rank, so every rank computes the
  same gate and weights; the coherence reward calibrates on every rank's answers.
- Commands: rank 0 claims them at the step boundary and every rank applies the same list (one
  all_gather per boundary, which also carries any rank's signal-stop). A pause holds every rank:
  rank 0 polls the queue, the others wait in that exchange.
- A rank that dies: the survivors' next collective fails (gloo sees the closed connection; the
  collective timeout backs it up) and rank 0 marks the run failed. If rank 0 itself dies, the
  launching `carl train` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from contextlib import suppress
from pathlib import Path
from types import FrameType
from typing import Any

from engine import paths
from engine.store import Store, StoreError
from engine.system.run_processes import note_own, rank_info

from .backend import BadInput, Reporter
from .config import TrainConfig
from .data import checked_inputs
from .lifecycle import EXIT_BAD_INPUT, EXIT_FAILED, open_run, say_error, train_run
from .rank_processes import LauncherReport, agent_row, end_self, note_ranks_of, note_self
from .ranks import signals_deferred, start_ranks, training_backend

EXIT_FILE_ENV = "CARL_EXIT_FILE"  # where rank 0 leaves its exit code for the launching carl train
POLL_SECONDS = 0.2
LAUNCHER_STDERR_JOIN_S = 10.0  # a rank that outlives the launcher keeps its stderr open: waited no longer


# -- inside a rank -----------------------------------------------------------------------------------


def run_rank(
    config: TrainConfig, *, home: Path, run_name: str | None, resume: str | None, attach: int | None
) -> int:
    """One rank of a launched run: join the group, open (or attach to) the run on rank 0, train."""
    ranks = start_ranks()
    everyone = ranks.all_gather(rank_info(ranks.rank))  # rank 0 records every rank's process
    store: Store | None = None
    code = EXIT_BAD_INPUT
    with signals_deferred():
        opened: tuple[int, str] | None = None
        error: str | None = None
        if ranks.is_main:
            try:
                store = Store(paths.db_path(home))
                if attach is not None:
                    opened = _attach_run(store, attach)
                else:  # started by `accelerate launch` by hand: the stored config says how many ranks
                    config = config.model_copy(update={"processes": ranks.world})
                    run_id, output_dir = open_run(store, config, home, run_name, resume)
                    opened = (run_id, str(output_dir))
            except (StoreError, BadInput) as exc:
                error = str(exc)
        opened, error = ranks.broadcast((opened, error))
        try:
            if opened is None:
                if ranks.is_main:
                    say_error(error or "the run could not be opened")
            else:
                run_id, opened_dir = opened
                note_ranks_of(store, run_id, everyone)
                code = train_run(
                    store, run_id, config, home, Path(opened_dir), resuming=resume is not None, ranks=ranks
                )
        finally:
            if ranks.is_main:
                _leave_exit_code(code)
                if store is not None:
                    if opened is not None:
                        end_self(store, opened[0], code)
                    store.close()
        _leave_group()
    return code


def _attach_run(store: Store, run_id: int) -> tuple[int, str]:
    """The run the launching carl train opened; rank 0's pid stands for it from now on (the process
    that writes it, and that a stop signal should reach)."""
    run = store.run(run_id)
    if run is None or not run["output_dir"]:
        raise BadInput(f"--attach {run_id}: no such run")
    store.update_run(run_id, pid=os.getpid())
    return run_id, str(run["output_dir"])


def _leave_exit_code(code: int) -> None:
    path = os.environ.get(EXIT_FILE_ENV)
    if path:
        with suppress(OSError):
            Path(path).write_text(f"{code}\n")


def _leave_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # leaving is best effort: the process ends next
        pass


# -- the launching carl train ------------------------------------------------------------------------


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_processes(processes: int) -> None:
    """One process per GPU, or per CPU core without one; more is refused before anything starts."""
    if processes <= 1:
        return
    import torch

    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        if processes > gpus:
            raise BadInput(f"--processes {processes}: this machine has {gpus} GPU(s), one process per GPU")
        return
    cores = available_cores()
    if processes > cores:
        raise BadInput(
            f"--processes {processes}: no GPU, and this machine has {cores} CPU cores (one process per core)"
        )


def launch_argv(processes: int, home: Path, run_id: int, *, resume: bool) -> list[str]:
    """accelerate's launcher (torchrun under it; `--multi_gpu` is its name for that, on CPU too),
    on a free port, starting `python -m engine.training` attached to the run."""
    argv = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        "0",
        "-m",
        "engine.training",
        "--home",
        str(home),
        "--attach",
        str(run_id),
    ]
    return argv + (["--resume", str(run_id)] if resume else [])


def launch(config: TrainConfig, *, home: Path, run_name: str | None, resume: str | None) -> int:
    """`carl train --processes N`: open the run, launch the ranks, wait; record a failure no rank did."""
    try:
        training_backend(config)
        check_processes(config.processes)
        checked_inputs(config, home)  # what a rank would find while preparing: one line, before the launch
        with Store(paths.db_path(home)) as store:
            run_id, _ = open_run(store, config, home, run_name, resume)
            store.update_run(run_id, backend="torch")
            note_self(store, run_id, "launcher")
    except (BadInput, StoreError) as exc:
        say_error(str(exc))
        return EXIT_BAD_INPUT
    fd, exit_file = tempfile.mkstemp(prefix="carl-exit-")
    os.close(fd)
    try:
        argv = launch_argv(config.processes, home, run_id, resume=resume is not None)
        env = {**os.environ, EXIT_FILE_ENV: exit_file}
        # Its own session: a Ctrl-C in the terminal reaches this process alone, which turns it into a
        # stop at the next step boundary (torchrun's agent would tear the ranks down at once). Its stderr
        # comes through this process: every byte is copied on, and the ranks' ends it reports are recorded.
        proc = subprocess.Popen(argv, env=env, start_new_session=True, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        report = LauncherReport(proc.stderr, home, run_id).start()
        _note_agent(home, run_id, proc.pid)
        returncode = _wait(proc, home, run_id, report)
        report.join(LAUNCHER_STDERR_JOIN_S)
        proc.stderr.close()
        code = _read_exit_code(Path(exit_file))
    finally:
        Path(exit_file).unlink(missing_ok=True)
    with Store(paths.db_path(home)) as store:
        report.settle(store, proc.pid, returncode)
        run = store.run(run_id) or {}
        if code is None:  # rank 0 never settled the run: it died, or never started
            code = EXIT_FAILED
            if run.get("status") in ("running", "paused"):
                Reporter(store, run_id).set_status("failed", error=_launch_failure(run, returncode))
                run = store.run(run_id) or {}
        elif returncode != 0 and code == 0:
            say_error(f"a training process other than rank 0 failed (the launcher exited with {returncode})")
            code = EXIT_FAILED
        if run.get("status") == "failed" and run.get("error"):
            say_error(str(run["error"]))  # the last line, after the launcher's own report
        end_self(store, run_id, code)
    return code


def _note_agent(home: Path, run_id: int, pid: int) -> None:
    """accelerate's launcher as one of the run's processes (role launcher)."""
    try:
        with Store(paths.db_path(home)) as store:
            note_own(store, run_id, [agent_row(pid)])
    except Exception as exc:  # for watching the run only: the launch goes on
        say_error(f"could not record the launcher's process: {exc}")


def _launch_failure(run: dict[str, Any], returncode: int) -> str:
    pid = run.get("pid")
    if pid and pid != os.getpid():
        return (
            f"training process rank 0 (pid {pid}) died at step {run.get('last_step') or 0}; the others were"
            f" stopped (launcher exit code {returncode})"
        )
    return f"the training processes did not start (accelerate launch exited with code {returncode})"


def _wait(proc: subprocess.Popen[bytes], home: Path, run_id: int, report: LauncherReport) -> int:
    """Wait for the launcher. A first SIGTERM/SIGINT asks rank 0 to stop at the next step boundary (it
    tells the others), once rank 0 has joined the run; a second one ends the launcher and every rank."""
    received: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}
    asked = ended = False
    try:
        while True:
            try:
                return proc.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            if received and not asked and (rank0 := _rank0_pid(home, run_id)) is not None:
                _signal(rank0, signal.SIGTERM)
                asked = True
            if len(received) > 1 and not ended:
                report.stopping = True  # the ranks ended by us: no death
                _signal_group(proc.pid, signal.SIGTERM)
                ended = True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _rank0_pid(home: Path, run_id: int) -> int | None:
    try:
        with Store(paths.db_path(home)) as store:
            pid = (store.run(run_id) or {}).get("pid")
    except StoreError:
        return None
    return pid if pid and pid != os.getpid() else None


def _signal(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _read_exit_code(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None
