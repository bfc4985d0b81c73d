"""`carl report`: one self-contained HTML file of a run, several runs or an experiment, written by
the real CLI from a real store filled through the Store API."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from engine.store import Store

ROOT = Path(__file__).resolve().parent.parent
TASK_ONLY = {0: (0.5, 0.4), 1: (0.6, 0.5), 2: (0.7, 0.6)}  # seed: (held-out task, solved)
CASCADE = {0: (0.7, 0.6), 1: (0.8, 0.8)}  # seed 2 failed


def carl(
    home: Path,
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    pythonpath = os.pathsep.join(p for p in ((env or {}).get("PYTHONPATH"), str(ROOT)) if p)
    full = {**os.environ, "CARL_HOME": str(home), **(env or {}), "PYTHONPATH": pythonpath}
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd or ROOT,
        timeout=120,
    )


def phi_mean(step: int) -> float:
    return 0.9 + 0.001 * step


def fill_run(
    store: Store,
    name: str,
    steps: int,
    *,
    gate_opens: int | None = 20,
    source_kind: str = "carl",
    wiggle: float = 0.0,
) -> int:
    run_id = store.create_run(
        name, source_kind=source_kind, backend="torch", model="carl-tiny", max_steps=steps
    )
    rows = []
    for t in range(steps):
        rows += [
            (t, "reward", t / steps + 0.05 * math.sin(t + wiggle), 0.0),
            (t, "rewards/task/mean", t / steps, 0.0),
            (t, "rewards/format/mean", 0.5, 0.0),
            (t, "loss", 1.0 / (t + 1), 0.0),
        ]
    store.add_metrics(run_id, rows)
    store.add_phi_stats(
        run_id,
        [
            {
                "step": t,
                "phi_mean": phi_mean(t),
                "phi_p10": phi_mean(t) - 0.05,
                "phi_p90": phi_mean(t) + 0.03,
                "entropy_mean": 1.0 - 0.005 * t,
            }
            for t in range(steps)
        ],
    )
    if gate_opens is not None:
        store.add_gate_states(
            run_id,
            [
                {
                    "step": t,
                    "threshold": 0.3,
                    "state": "closed" if t < gate_opens else "ramping" if t < gate_opens + 5 else "open",
                    "multiplier": 0.0 if t < gate_opens else min(0.5, 0.1 * (t - gate_opens + 1)),
                    "reason": "closed: waiting" if t < gate_opens else f"since step {gate_opens}",
                }
                for t in range(steps)
            ],
        )
    return run_id


def fill_store(home: Path) -> None:
    """alpha: a carl run with Φ, rewards, a gate and two evals; beta: an observed run without a gate;
    fresh: no metrics; experiment abl: task-only x 3 seeds, cascade x 2 finished seeds and a failed one."""
    with Store(home / "carl.db") as store:
        alpha = fill_run(store, "alpha", 60)
        store.add_eval(alpha, False, {"task": 0.2, "solved": 0.1}, ["mean task reward 0.2 < 0.5"])
        store.add_eval(
            alpha,
            True,
            {"task": 0.7, "solved": 0.6, "format": 0.9, "phi": 0.95, "prompts": 16},
            ["mean task reward 0.7 ≥ 0.5", "format-compliant answers 0.9 ≥ 0.8"],
        )
        fill_run(store, "beta", 40, gate_opens=None, source_kind="jsonl")
        store.create_run("fresh", source_kind="carl", backend="mlx", model="carl-tiny", max_steps=10)
        experiment = store.create_experiment(
            "abl", {"name": "demo"}, ["task-only", "cascade"], [0, 1, 2], 30, 5
        )
        for arm, results in (("task-only", TASK_ONLY), ("cascade", CASCADE)):
            for seed in (0, 1, 2):
                run_id = fill_run(store, f"abl-{arm}-s{seed}", 30, gate_opens=10 + seed, wiggle=seed)
                if seed in results:
                    task, solved = results[seed]
                    store.add_eval(run_id, task >= 0.5, {"task": task, "solved": solved}, [f"task {task}"])
                    store.update_experiment_run(
                        experiment,
                        arm,
                        seed,
                        run_id=run_id,
                        status="finished",
                        task=task,
                        solved=solved,
                        gate_step=10 + seed,
                        final_phi=phi_mean(29),
                    )
                else:
                    store.update_run(run_id, status="failed", error="out of memory")
                    store.update_experiment_run(
                        experiment, arm, seed, run_id=run_id, status="failed", error="out of memory"
                    )
        store.create_experiment("waiting", {"name": "demo"}, ["cascade"], [0], 30, 5)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("report") / "home"
    home.mkdir()
    fill_store(home)
    return home


class Page(HTMLParser):
    """What a browser would see of the report: headings, text, scripts (each chart's figure under the
    heading just above it) and anything it would fetch from elsewhere."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.chart_titles: list[str] = []
        self.remote: list[str] = []
        self.text: list[str] = []
        self._in_heading = self._in_script = False
        self.feed(path.read_text(encoding="utf-8"))
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for key in ("src", "href"):
            if tag != "a" and (found.get(key) or "").startswith(("http:", "https:", "//")):
                self.remote.append(f"<{tag} {key}={found[key]}>")
        if tag in ("h1", "h2", "h3"):
            self._in_heading = True
            self.headings.append("")
        if tag == "script":
            self._in_script = True
            self.scripts.append((found, ""))
            if found.get("class") == "carl-figure":
                self.chart_titles.append(self.headings[-1])

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h1", "h2", "h3"):
            self._in_heading = False
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            attrs, body = self.scripts[-1]
            self.scripts[-1] = (attrs, body + data)
            return
        self.text.append(data)
        if self._in_heading:
            self.headings[-1] += data

    def charts(self) -> list[tuple[dict[str, str | None], str]]:
        return [(a, b) for a, b in self.scripts if a.get("class") == "carl-figure"]

    def figures(self) -> dict[str, dict[str, Any]]:
        """Each chart's figure, parsed from its JSON block, by its title."""
        return {
            title: json.loads(body) for title, (_, body) in zip(self.chart_titles, self.charts(), strict=True)
        }


def read_page(path: Path) -> Page:
    return Page(path)


def assert_self_contained(page: Page) -> None:
    assert page.remote == []
    assert all(not attrs.get("src") for attrs, _ in page.scripts)
    bundles = [body for attrs, body in page.scripts if not attrs and "plotly.js v" in body[:200]]
    assert len(bundles) == 1 and len(bundles[0]) > 1_000_000  # plotly.js itself, once
    for attrs, body in page.charts():
        assert attrs["type"] == "application/json"
        json.loads(body)  # each figure parses


def test_report_of_one_run_charts_phi_rewards_gate_and_eval(home: Path, tmp_path: Path) -> None:
    result = carl(home, "report", "alpha", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    path = tmp_path / "carl-report-alpha.html"
    assert result.stdout.strip() == str(path)
    page = read_page(path)
    assert_self_contained(page)
    assert "Run alpha" in page.headings
    figures = page.figures()
    assert set(figures) == {
        "Φ and entropy — alpha",
        "Rewards — alpha",
        "Cascade gate — alpha (opened at step 20)",
        "Held-out eval — alpha",
    }

    phi = {t["name"]: t for t in figures["Φ and entropy — alpha"]["data"]}
    assert set(phi) == {"Φ p90", "Φ p10–p90", "Φ mean", "entropy (nats)"}
    assert phi["Φ mean"]["x"] == list(range(60))
    assert phi["Φ mean"]["y"] == pytest.approx([phi_mean(t) for t in range(60)])
    assert phi["Φ p10–p90"]["y"] == pytest.approx([phi_mean(t) - 0.05 for t in range(60)])
    assert phi["Φ p10–p90"]["fill"] == "tonexty" and phi["entropy (nats)"]["yaxis"] == "y2"

    rewards = [t["name"] for t in figures["Rewards — alpha"]["data"]]
    assert rewards == ["reward", "rewards/format/mean", "rewards/task/mean"]  # loss is not a reward

    gate = figures["Cascade gate — alpha (opened at step 20)"]
    traces = {t["name"]: t for t in gate["data"]}
    assert traces["state"]["y"][19:21] == [0, 1] and traces["state"]["y"][-1] == 2
    assert traces["multiplier"]["y"][24] == pytest.approx(0.5)
    [opened] = gate["layout"]["shapes"]
    assert opened["x0"] == opened["x1"] == 20

    [bars] = figures["Held-out eval — alpha"]["data"]
    assert dict(zip(bars["x"], bars["y"], strict=True)) == {
        "task": 0.7,
        "solved": 0.6,
        "format": 0.9,
        "phi": 0.95,
    }
    text = " ".join(page.text)
    assert "format-compliant answers 0.9 ≥ 0.8" in text  # the newest eval's reasons ...
    assert "0.2 < 0.5" not in text  # ... not the older one's
    assert "passed" in text and "since step 20" in text


def test_report_of_an_experiment_compares_its_runs_and_arms(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = carl(home, "report", "abl", "-o", str(out))  # a folder: the default name inside it
    assert result.returncode == 0, result.stderr
    path = out / "carl-report-abl.html"
    assert result.stdout.strip() == str(path)
    page = read_page(path)
    assert_self_contained(page)
    names = [f"abl-{arm}-s{seed}" for arm in ("task-only", "cascade") for seed in (0, 1, 2)]
    for name in names:
        assert f"Run {name}" in page.headings
    for heading in ("Experiment abl", "Held-out results by arm", "Cells", "Comparison"):
        assert heading in page.headings
    figures = page.figures()
    for title in (
        "Held-out task reward by arm",
        "Held-out solved share by arm",
        "Φ by run",
        "Entropy by run",
        "Reward by run",
        "Reward task by run",
        "Reward format by run",
        "Cascade gate multiplier by run",
    ):
        assert title in figures, title

    phi = figures["Φ by run"]["data"]
    assert [t["name"] for t in phi] == [
        f"{arm} · seed {seed}" for arm in ("task-only", "cascade") for seed in (0, 1, 2)
    ]
    colours = [t["line"]["color"] for t in phi]
    assert len(set(colours)) == 6  # one colour per run
    gate = figures["Cascade gate multiplier by run"]["data"]
    assert [t["x"] for t in gate if t["mode"] == "markers"] == [[10], [11], [12]] * 2  # where each opened

    # Per arm, over finished seeds: mean and Student's t 95% interval (t = 4.303 for 3 seeds, 12.706 for 2).
    text = " ".join(page.text)
    assert "0.600 [0.352, 0.848]" in text  # task-only task: 0.5, 0.6, 0.7
    assert "0.500 [0.252, 0.748]" in text  # task-only solved
    assert "0.750 [0.115, 1.385]" in text  # cascade task: 0.7, 0.8 (the failed seed left out)
    assert "0.700 [-0.571, 1.971]" in text  # cascade solved: 0.6, 0.8
    assert "2 of 3" in text and "out of memory" in text
    bars = figures["Held-out task reward by arm"]["data"]
    assert bars[0]["x"] == ["task-only", "cascade"] and bars[0]["y"] == pytest.approx([0.6, 0.75])
    assert bars[0]["error_y"]["array"] == pytest.approx([0.248414, 0.635310], abs=1e-5)
    assert sorted(bars[1]["y"]) == pytest.approx([0.5, 0.6, 0.7, 0.7, 0.8])  # each finished seed


def test_report_of_several_runs_says_which_have_no_metrics(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "two.html"
    result = carl(home, "report", "alpha", "fresh", "2", "-o", str(path))  # "2": beta by id
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(path)
    page = read_page(path)
    assert_self_contained(page)
    assert {"Run alpha", "Run fresh", "Run beta", "Comparison"} <= set(page.headings)
    text = " ".join(page.text)
    assert "No metrics yet: run fresh has logged no steps" in text
    assert "No metrics yet: fresh." in text
    assert "No cascade gate in this run." in text  # beta's
    figures = page.figures()
    assert [t["name"] for t in figures["Φ by run"]["data"]] == ["alpha", "beta"]
    assert not any("fresh" in title for title in figures)


def test_report_of_a_run_without_metrics_still_says_so(home: Path, tmp_path: Path) -> None:
    result = carl(home, "report", "fresh", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    page = read_page(tmp_path / "carl-report-fresh.html")
    assert_self_contained(page)
    assert "No metrics yet: run fresh has logged no steps, so there is nothing to chart." in " ".join(
        page.text
    )
    assert page.figures() == {}


def test_report_of_an_experiment_with_no_run_yet(home: Path, tmp_path: Path) -> None:
    result = carl(home, "report", "waiting", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(read_page(tmp_path / "carl-report-waiting.html").text)
    assert "No cell has started a run yet." in text and "No cell has a held-out result yet." in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "carl: nope: no such run or experiment (newest runs: "),
        (["alpha", "nope"], "carl: nope: no such run or experiment"),
        (["alpha", "abl"], "carl: abl is an experiment: report it on its own (carl report abl)"),
        (["alpha", "-o", "/no/such/dir/r.html"], "carl: /no/such/dir/r.html: cannot write the report"),
    ],
)
def test_bad_input_is_one_line(home: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = carl(home, "report", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


def test_no_store_and_no_plotly_are_one_line(home: Path, tmp_path: Path) -> None:
    result = carl(tmp_path / "empty-home", "report", "alpha", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("carl: no store at "), result.stderr
    # A plotly that cannot be imported (as on the base install): the report says which extra to install.
    shadow = tmp_path / "shadow" / "plotly"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('plotly is not installed')\n")
    result = carl(home, "report", "alpha", cwd=tmp_path, env={"PYTHONPATH": str(shadow.parent)})
    assert result.returncode == 2
    assert result.stderr == "carl: install the report extra: pip install 'carl-tui[report]'\n"
    assert not (tmp_path / "carl-report-alpha.html").exists()


BROWSER = next((b for b in ("chromium-headless-shell", "chromium", "google-chrome") if shutil.which(b)), None)


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium on this machine")
def test_a_browser_draws_every_chart_offline(home: Path, tmp_path: Path) -> None:
    assert carl(home, "report", "abl", cwd=tmp_path).returncode == 0
    path = tmp_path / "carl-report-abl.html"
    charts = len(read_page(path).charts())
    dom = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--virtual-time-budget=10000",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert charts > 10 and dom.count('class="plot-container plotly"') == charts  # plotly drew each one
