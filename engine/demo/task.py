"""The demo task: answer a request with one JSON tool call (a `toolcall` task, see `engine.tasks`).

`task_rows` are the requests with their gold call as `completion` and the answer columns
`answer_tool` and `answer_city`, which the task reward checks (the agents plane serves these).

`demo_rows`, the `demo` dataset a run trains on, keeps the gold answer columns but takes its
`completion`s from a weaker teacher, as a real warm-up set logged from an older assistant would:
`TEACHER_SAMPLES` sampled answers per request, and on "time" and "hotels" requests the teacher
calls the right tool only `TEACHER_RIGHT` of the time (it confuses time with weather and hotels
with news). The SFT warm-up imitates those samples, mistakes included, so its greedy answers to
such requests are wrong while the right tool stays likely enough to be sampled: exactly what GRPO,
rewarded by the verifier and not by the demonstrations, can fix. The rewards are the shared ones made
for this task: `task` and `format` give partial credit, so even a barely trained tiny model earns
small, varying rewards and GRPO has a gradient from the first step.
"""

from __future__ import annotations

import random
from typing import Any

from engine.models.corpus import CITIES, CITY_REQUESTS, CITY_TOOLS, tool_call
from engine.rewards import concise_reward, make_format_reward, make_task_reward
from engine.tasks import ToolCallTask

TASK = ToolCallTask()


# The weaker teacher: the tool it calls instead, for the requests it gets wrong.
TEACHER_CONFUSES = {"get_time": "get_weather", "find_hotels": "get_news"}
TEACHER_RIGHT = 0.35  # the share of those requests it answers with the right tool
TEACHER_SAMPLES = 4  # sampled answers per request in the warm-up set


def task_rows(seed: int = 0) -> list[dict[str, Any]]:
    """Every (tool, city, phrasing) combination, shuffled: 4 x 16 x 6 = 384 conversational rows."""
    rows = [
        {
            "prompt": [{"role": "user", "content": request.format(phrase=phrase, city=city)}],
            "completion": [{"role": "assistant", "content": tool_call(tool, city=city)}],
            "answer_tool": tool,
            "answer_city": city,
        }
        for tool, phrase in sorted(CITY_TOOLS.items())
        for city in CITIES
        for request in CITY_REQUESTS
    ]
    random.Random(seed).shuffle(rows)
    return rows


def demo_rows(seed: int = 0) -> list[dict[str, Any]]:
    """Each request `TEACHER_SAMPLES` times, each with its own sample of the weaker teacher's answer
    as `completion`; the answer columns stay the gold ones. Identical prompts stay together on one
    side of the held-out split (`engine.training.holdout`)."""
    rng = random.Random(f"teacher-{seed}")
    rows = []
    for row in task_rows(seed):
        for _ in range(TEACHER_SAMPLES):
            tool = row["answer_tool"]
            if tool in TEACHER_CONFUSES and rng.random() >= TEACHER_RIGHT:
                tool = TEACHER_CONFUSES[tool]
            answer = tool_call(tool, city=row["answer_city"])
            rows.append({**row, "completion": [{"role": "assistant", "content": answer}]})
    return rows


REWARD_FUNCS = [make_format_reward(TASK), make_task_reward(TASK), concise_reward]
