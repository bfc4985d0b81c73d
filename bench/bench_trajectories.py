"""Trajectory scoring plus advantages (docs/reference/karl.md §3, §4): goal >= 20,000 trajectories/s.

100,000 deterministic synthetic trajectories of 50 events each (a realistic tool mix: reads,
searches, edits, Bash with test/build commands and exit codes, a few failures), built before any
timing. Timed: `score_many` (the column-wise path the store uses) and `compute_advantages` over
the whole set, objects in, `Scored` objects and advantages out.

Baseline, measured in the same run: the plain reference scorer and reference advantages (the
literal transcription of the formulas that the tests use as oracle) on a 5,000-trajectory subset,
extrapolated as a rate. The ratio says what the column-wise path buys.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.trajectories.scoring.advantages import compute_advantages  # noqa: E402
from engine.trajectories.scoring.signals import score_many  # noqa: E402
from engine.trajectories.trajectory import Event, Trajectory  # noqa: E402
from tests.test_trajectory_scoring import reference_advantages, reference_score  # noqa: E402

TRAJECTORIES = 100_000
EVENTS = 50
BASELINE_SUBSET = 5_000
GOAL = 20_000
SEED = 20_260_523
TOOL_MIX = {
    "Read": 30,
    "Bash": 22,
    "Edit": 14,
    "Grep": 10,
    "Glob": 5,
    "Write": 5,
    "TaskUpdate": 4,
    "WebFetch": 2,
    "WebSearch": 2,
    "Agent": 2,
    "NotebookEdit": 1,
    "mcp__github__get_issue": 3,
}
COMMANDS = (
    "pytest -q tests/test_{m}.py",
    "python -m pytest -x -k {m}",
    "npm test -- {m}",
    "cargo build --release",
    "cargo test {m}",
    "make build",
    "go test ./{m}/...",
    "git status --short",
    "git diff src/{m}.py",
    "ls -la src/{m}",
    "rg -n {m} src",
    "npm run build",
    "python scripts/{m}.py --check",
)
MODULES = ("api", "store", "auth", "cli", "models", "utils", "views", "parser", "config", "jobs")
DOMAINS = ("python", "web", "rust", "infra", "data", None)


def build_event(rng: random.Random, tool: str, repo: str, files: list[str], at: float) -> Event:
    """One event whose strings are fresh objects, as a store or transcript load gives them."""
    params: dict[str, str] = {}
    success: bool | None = rng.random() >= 0.08
    exit_code = None
    if tool in ("Read", "Edit", "Write", "NotebookEdit"):
        params["file_path"] = f"/home/dev/{repo}/{rng.choice(files)}"
    elif tool == "Bash":
        params["command"] = rng.choice(COMMANDS).format(m=rng.choice(MODULES))
        exit_code = None if rng.random() < 0.3 else (0 if success else rng.choice((1, 2, 127)))
    elif tool in ("Grep", "Glob"):
        params["pattern"] = (
            f"def {rng.choice(MODULES)}_" if tool == "Grep" else f"src/**/*{rng.choice(MODULES)}*.py"
        )
    elif tool in ("WebFetch", "WebSearch"):
        params["url" if tool == "WebFetch" else "query"] = f"https://docs.example.org/{rng.choice(MODULES)}"
    if rng.random() < 0.02:
        success = None  # a tool result that never arrived
    return Event(tool, success, exit_code, rng.uniform(5, 4000), at, params)


def build_trajectories(count: int, seed: int = SEED) -> list[Trajectory]:
    rng = random.Random(seed)
    tools, weights = list(TOOL_MIX), list(TOOL_MIX.values())
    out = []
    for i in range(count):
        repo = f"proj{i % 97}"
        files = [f"src/{rng.choice(MODULES)}/{rng.choice(MODULES)}.py" for _ in range(rng.randint(2, 9))]
        start = 1_760_000_000.0 + 90.0 * i
        names = rng.choices(tools, weights, k=EVENTS)
        events = [build_event(rng, name, repo, files, start + 4.0 * j) for j, name in enumerate(names)]
        flags = [rng.choice((None, None, True, False)) for _ in range(4)]
        out.append(
            Trajectory(
                f"uid{i}",
                f"session{i // 5}",
                "claude-code",
                "bench",
                prompt=f"fix {repo}",
                cwd=f"/home/dev/{repo}",
                git_repo=repo,
                started_at=start,
                ended_at=start + rng.uniform(20, 1800),
                events=events,
                correction=flags[0],
                redo=flags[1],
                build_success=flags[2],
                session_continued=flags[3],
                domain=rng.choice(DOMAINS),
            )
        )
    return out


def bench_fast(trajectories: list[Trajectory]) -> tuple[float, float, float, float]:
    """(trajectories/s overall, seconds scoring, seconds advantages, CPU seconds overall)."""
    cpu = time.process_time()
    started = time.perf_counter()
    scored = score_many(trajectories)
    scored_at = time.perf_counter()
    advantages, _ = compute_advantages([s.reward for s in scored], [t.domain for t in trajectories])
    done = time.perf_counter()
    assert len(advantages) == len(trajectories)
    return (
        len(trajectories) / (done - started),
        scored_at - started,
        done - scored_at,
        time.process_time() - cpu,
    )


def bench_reference(trajectories: list[Trajectory]) -> float:
    started = time.perf_counter()
    rewards = [reference_score(t)["reward"] for t in trajectories]
    reference_advantages(rewards, [t.domain for t in trajectories])
    return len(trajectories) / (time.perf_counter() - started)


def main() -> None:
    built = time.perf_counter()
    trajectories = build_trajectories(TRAJECTORIES)
    build_s = time.perf_counter() - built
    rate, score_s, adv_s, cpu_s = bench_fast(trajectories)
    base_rate = bench_reference(trajectories[:BASELINE_SUBSET])
    print(f"built {TRAJECTORIES:,} trajectories x {EVENTS} events in {build_s:.1f}s (not timed)")
    # CPU time says how much of the wall time was other processes on this shared 2-core box.
    print(
        f"score_many={score_s:.2f}s compute_advantages={adv_s:.3f}s cpu={cpu_s:.2f}s "
        f"(cpu-bound rate {TRAJECTORIES / cpu_s:,.0f}/s)"
    )
    print(
        f"trajectories_scored_per_s={rate:,.0f} goal>={GOAL:,} "
        f"baseline_reference_scorer_per_s={base_rate:,.0f} (on {BASELINE_SUBSET:,}) "
        f"ratio={rate / base_rate:.1f} {'OK' if rate >= GOAL else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
