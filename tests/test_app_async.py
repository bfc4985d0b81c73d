"""Async RL in the control room, through Pilot on a veRL run `carl observe` imported (its file logger JSONL):
the Rewards pane's title says the sampler/learner mismatch and the samples' staleness, fitted to the pane at
80×24 and 160×50; the metrics explorer shows the async-RL keys under one heading and the perf/* keys under
another."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import until
from test_app_explorer import explorer, listed, open_explorer
from test_health_async import rising_k3, verl_step
from test_observe_jsonl_frameworks import VerlFileLogger

from carl_tui.app import ControlRoom
from carl_tui.explorer_model import KEY_GROUPS, KeyInfo, group_title, order_keys
from engine.observe import observe
from engine.store import Store

STEPS = 100
ASYNC_HEADING, PERF_HEADING = (heading for heading, _ in KEY_GROUPS)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "logs" / "proj" / "verl_async.jsonl"
    path.parent.mkdir(parents=True)
    logger = VerlFileLogger(path)
    for step, k3 in zip(range(1, STEPS + 1), rising_k3(range(1, STEPS + 1)), strict=True):
        data = verl_step(step, k3)
        data.update({"perf/throughput": 2_400.0, "timing_s/step": 30.0, "response/aborted_ratio": 0.01})
        logger.log(data, step)
    logger.finish()
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Store(home / "carl.db") as store:
        observe(store, path)
    return home


def rewards_title(app: ControlRoom) -> str:
    return str(app.query_one("#rewards-pane").border_title)


async def test_the_rewards_title_says_mismatch_and_staleness_at_both_sizes(home: Path) -> None:
    k3, stale = f"{rising_k3(range(1, STEPS + 1))[-1]:.2g}", "0.8"
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.main.view is not None and "mismatch" in rewards_title(app))
        assert rewards_title(app) == f"Rewards · total 0.500 · mismatch KL {k3} · stale {stale}"
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: "total" not in rewards_title(app))
        # narrower: the word "total" and "KL" go, the numbers stay, and the title fits its pane's border
        assert rewards_title(app) == f"Rewards 0.500 · mismatch {k3} · stale {stale}"
        pane = app.query_one("#rewards-pane")
        assert len(rewards_title(app)) + 6 <= pane.outer_size.width
        await pilot.resize_terminal(160, 50)
        await until(pilot, lambda: "mismatch KL" in rewards_title(app))


async def test_the_explorer_groups_the_async_and_perf_keys(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_explorer(pilot, app, "verl_async")
        lines = listed(screen)
        headings = [line for line in lines if not line.startswith("  ")]
        # the families first, after the keys without a prefix; then the other prefixes by name
        assert headings[:4] == ["(no prefix)", group_title(ASYNC_HEADING), PERF_HEADING, "actor"]
        start = lines.index(ASYNC_HEADING)
        group = [line.split()[0] for line in lines[start + 1 : lines.index(headings[2])]]
        # the canonical names first, then the framework's own keys no table renames
        assert [name.split("/")[0] for name in group] == [
            "mismatch",
            "staleness",
            "staleness",
            "rollout_corr",  # rollout_corr/chi2_token, cut to the list's width at 80 columns
            "rollout_corr",  # rollout_corr/kl: veRL's k1 estimate, k3 is mismatch/kl
        ]
        assert group[:3] == ["mismatch/kl", "staleness/max", "staleness/mean"]
        perf = lines[lines.index(PERF_HEADING) + 1 : lines.index("actor")]
        assert len(perf) >= 4 and all(line.startswith("  perf/") for line in perf)
        assert explorer(app) is screen


def test_the_families_order_canonical_names_before_raw_ones() -> None:
    keys = [
        KeyInfo(k)
        for k in (
            "async/keep_rate",
            "perf/mfu",
            "off_policy/dropped",
            "loss",
            "mismatch/kl",
            "fully_async/count/total_generated_samples",
            "staleness/mean",
            "actor/x",
        )
    ]
    ordered = [info.key for info in order_keys(keys)]
    assert ordered == [
        "loss",
        "mismatch/kl",
        "staleness/mean",
        "off_policy/dropped",
        "fully_async/count/total_generated_samples",
        "async/keep_rate",
        "perf/mfu",
        "actor/x",
    ]
    assert {info.group for info in keys if info.key.startswith(("async/", "mismatch/"))} == {ASYNC_HEADING}
