"""The plane's alarms on live scores: each fires on data that should fire it, stays quiet on data that
should not, fires once while its condition lasts, and again only after it has cleared."""

from __future__ import annotations

import itertools

import pytest

from engine.agents.alarms import AlarmMonitor
from engine.agents.events import AlarmEvent
from engine.agents.plane_settings import AlarmSettings

SETTINGS = AlarmSettings(window=4)  # an alarm looks at a worker from 2 results on
_ids = itertools.count()


def monitor(**settings: float) -> AlarmMonitor:
    return AlarmMonitor(SETTINGS.model_copy(update=settings), ack_wait_s=30.0)


def result(
    m: AlarmMonitor,
    worker: str,
    *,
    prm: float = 0.5,
    verifier: float | None = None,
    outcome: float = 0.5,
    feedback: float = 0.5,
    feedback_first: bool = False,
) -> list[AlarmEvent]:
    """One result of `worker`, its scores and its feedback (in either order); the alarms they raise."""
    task_id = f"t{next(_ids)}"
    if feedback_first:
        return [*m.feedback(task_id, worker, feedback), *m.scored(task_id, worker, prm, verifier, outcome)]
    return [*m.scored(task_id, worker, prm, verifier, outcome), *m.feedback(task_id, worker, feedback)]


def kinds(alarms: list[AlarmEvent]) -> list[tuple[str, str | None]]:
    return [(a.kind, a.worker_id) for a in alarms]


# ============================================================================================ collusion


def test_collusion_fires_when_feedback_drifts_from_the_verifier() -> None:
    m = monitor(hacking_high=1.0)  # reward hacking kept out of the way (nothing here scores 1.0)
    assert result(m, "w1", verifier=0.2, feedback=0.9) == []  # one result is not yet half a window
    alarms = result(m, "w1", verifier=0.16, feedback=0.94, feedback_first=True)
    assert kinds(alarms) == [("collusion", "w1")]
    alarm = alarms[0]
    assert (
        alarm.reason
        == "manager feedback 0.92 vs verifier 0.18 over the last 2 results of w1 (gap 0.74 > 0.30)"
    )
    assert alarm.metrics["gap"] == pytest.approx(0.74) and alarm.task_id is not None


def test_collusion_falls_back_to_the_prm_without_a_verifier() -> None:
    m = monitor()
    result(m, "w1", prm=0.1, feedback=0.8)
    [alarm] = result(m, "w1", prm=0.1, feedback=0.8)
    assert "manager feedback 0.80 vs PRM 0.10" in alarm.reason


def test_no_collusion_when_feedback_agrees_or_halves_are_missing() -> None:
    m = monitor()
    for _ in range(6):
        assert result(m, "w1", verifier=0.8, prm=0.1, feedback=0.7) == []  # the verifier is the reference
    lone = monitor()
    for n in range(6):
        assert lone.scored(f"s{n}", "w1", 0.1, 0.1, 0.1) == []  # no feedback: nothing to compare
    assert lone.feedback("s0", "w1", 0.9) == []  # one joined result is not half a window


def test_collusion_fires_once_until_it_clears() -> None:
    m = monitor()
    fired = [kinds(result(m, "w1", verifier=1.0, feedback=0.0)) for _ in range(5)]
    assert fired == [[], [("collusion", "w1")], [], [], []]
    cleared = [kinds(result(m, "w1", verifier=1.0, feedback=1.0)) for _ in range(4)]
    assert cleared == [[], [], [], []]  # the window drifts back below the gap
    again = [kinds(result(m, "w1", verifier=1.0, feedback=0.0)) for _ in range(3)]
    assert again == [[], [("collusion", "w1")], []]


# ======================================================================================= reward hacking


def test_reward_hacking_fires_on_high_scores_the_verifier_fails() -> None:
    m = monitor(collusion_gap=1.0)  # collusion kept out of the way (a gap can never exceed 1)
    assert result(m, "w1", prm=0.9, verifier=0.1, feedback=0.2) == []
    [alarm] = result(m, "w1", prm=0.3, verifier=0.2, feedback=0.8)
    assert alarm.kind == "reward_hacking" and alarm.worker_id == "w1"
    assert alarm.reason == (
        "2 of the last 2 verified results of w1 scored high (feedback or PRM >= 0.70) while the verifier "
        "gave < 0.50 (share 1.00 >= 0.50)"
    )
    assert result(m, "w1", prm=0.9, verifier=0.1) == []  # still true: no repeat


def test_no_reward_hacking_when_the_verifier_agrees_or_is_absent() -> None:
    m = monitor(collusion_gap=1.0)
    for _ in range(4):
        assert result(m, "w1", prm=0.9, verifier=0.9, feedback=0.9) == []  # high and right
        assert result(m, "w2", prm=0.9, verifier=None, feedback=0.9) == []  # nothing to fail it
        assert result(m, "w3", prm=0.3, verifier=0.1, feedback=0.3) == []  # low and wrong
    mixed = monitor(collusion_gap=1.0, hacking_share=0.75)
    outcomes = [kinds(result(mixed, "w1", prm=0.9, verifier=v)) for v in (0.1, 0.9, 0.1, 0.9)]
    assert outcomes == [[], [], [], []]  # 2 of 4 is below the 0.75 share


def test_reward_hacking_clears_and_fires_again() -> None:
    m = monitor(collusion_gap=1.0)
    first = [kinds(result(m, "w1", prm=0.9, verifier=0.0)) for _ in range(2)]
    healthy = [kinds(result(m, "w1", prm=0.9, verifier=1.0)) for _ in range(4)]
    second = [kinds(result(m, "w1", prm=0.9, verifier=0.0)) for _ in range(3)]
    assert first == [[], [("reward_hacking", "w1")]] and healthy == [[]] * 4
    assert second == [[], [("reward_hacking", "w1")], []]  # 2 of 4 reaches the 0.5 share again


# ==================================================================================== worker divergence


def test_a_worker_far_from_the_others_diverges() -> None:
    m = monitor()
    for _ in range(2):
        assert result(m, "w1", outcome=0.8) == [] and result(m, "w2", outcome=0.75) == []
        assert result(m, "w4", outcome=0.8) == []
    assert result(m, "w3", outcome=0.2) == []  # one result: not yet half a window
    alarms = result(m, "w3", outcome=0.22)
    assert kinds(alarms) == [("worker_divergence", "w3")]
    assert alarms[0].reason == (
        "w3 mean outcome 0.21 over its last 2 results vs 0.78 for the other 3 workers (gap 0.57 > 0.25)"
    )
    assert result(m, "w3", outcome=0.5) == []  # still far (0.31): no repeat


def test_no_divergence_with_one_worker_or_close_workers() -> None:
    m = monitor()
    for outcome in (0.0, 1.0, 0.0, 1.0):
        assert result(m, "w1", outcome=outcome) == []  # nobody to compare with
    for outcome in (0.4, 0.6, 0.5, 0.55):
        assert result(m, "w2", outcome=outcome) == []  # 0.5 vs 0.51: close


def test_divergence_clears_when_the_worker_recovers_and_fires_again() -> None:
    m = monitor()
    for _ in range(2):
        result(m, "w1", outcome=0.9)
    assert [kinds(result(m, "w2", outcome=0.1)) for _ in range(2)] == [
        [],
        [("worker_divergence", "w1"), ("worker_divergence", "w2")],
    ]  # two workers: both apart
    assert [kinds(result(m, "w2", outcome=0.9)) for _ in range(4)] == [[], [], [], []]
    assert kinds(result(m, "w2", outcome=0.0)) == []  # 0.675 vs 0.9: within 0.25
    assert kinds(result(m, "w2", outcome=0.0)) == [("worker_divergence", "w1"), ("worker_divergence", "w2")]


# ========================================================================================== stuck worker


def test_a_task_held_past_the_ack_wait_is_reported_once() -> None:
    m = monitor()
    m.started("t1", "w1", now=100.0)
    m.started("t2", "w2", now=110.0)
    assert m.check_stuck(now=130.0) == []  # exactly the ack wait: not yet
    [alarm] = m.check_stuck(now=131.0)
    assert (alarm.kind, alarm.worker_id, alarm.task_id) == ("stuck_worker", "w1", "t1")
    assert alarm.reason == "w1 has held task t1 for 31.0 s without a result (ack wait 30.0 s)"
    assert alarm.metrics == {"held_s": 31.0, "ack_wait_s": 30.0}
    assert m.check_stuck(now=135.0) == []  # reported already
    m.finished("t2")
    assert m.check_stuck(now=500.0) == []  # t2 finished in time; t1 is still the one report


def test_a_repeated_busy_status_does_not_restart_the_clock() -> None:
    m = monitor()
    m.started("t1", "w1", now=0.0)
    m.started("t1", "w1", now=20.0)  # the same worker says it again
    assert kinds(m.check_stuck(now=31.0)) == [("stuck_worker", "w1")]


def test_a_redelivered_task_can_be_stuck_again() -> None:
    m = monitor()
    m.started("t1", "w1", now=0.0)
    assert kinds(m.check_stuck(now=31.0)) == [("stuck_worker", "w1")]
    m.started("t1", "w2", now=40.0)  # redelivered to another worker after the ack wait
    assert m.check_stuck(now=60.0) == []
    assert kinds(m.check_stuck(now=71.0)) == [("stuck_worker", "w2")]


def test_a_result_scored_twice_counts_once() -> None:
    m = monitor(hacking_high=1.0)
    m.scored("t1", "w1", 0.1, 0.1, 0.1)
    m.scored("t1", "w1", 0.1, 0.1, 0.1)  # a redelivery scored again
    assert m.feedback("t1", "w1", 0.9) == []  # a single joined result: below half a window
    assert m.feedback("t1", "w1", 0.9) == []  # a second feedback on it is ignored
    assert m.feedback("t2", "w1", 0.9) == [] and kinds(m.scored("t2", "w1", 0.1, 0.1, 0.1)) == [
        ("collusion", "w1")
    ]
