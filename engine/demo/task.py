"""The demo task: answer a request with one JSON tool call (a `toolcall` task, see `engine.tasks`).

The rows carry the gold call as `completion` (for the SFT warm-up) and the answer columns
`answer_tool` and `answer_city`, which the task reward checks. The rewards are the shared ones made
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


REWARD_FUNCS = [make_format_reward(TASK), make_task_reward(TASK), concise_reward]
