"""Field types for the settings models (carl.yaml, agents.yaml): numbers that are numbers,
names that are names.

pydantic's lax mode takes `true` for 1, "5" for 5 and 1e29 for an int that no SQLite column holds. A setting
is refused instead, with pydantic's one line naming the field: `Count` is an integer (an integral float such
as 3.0 too) of at most COUNT_MAX, `Int` one SQLite can store, `Real` a number that is not a bool or a text,
`Name` a valid name (engine/names.py).
Floats that are not finite are refused by the models themselves (`allow_inf_nan=False`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from engine.limits import COUNT_MAX, INT64_MAX, INT64_MIN, integer, shown
from engine.names import name_problem

SEED_MAX = 2**32 - 1  # numpy's seeds are 32-bit


def _integer(value: Any) -> int:
    number = integer(value)
    if number is None:  # pydantic's own words, and what it was given
        raise PydanticCustomError(
            "int_type", "Input should be a valid integer, not {given}", {"given": shown(value)}
        )
    return number


def _real(value: Any) -> Any:
    if isinstance(value, bool | str):
        raise PydanticCustomError(
            "float_type", "Input should be a valid number, not {given}", {"given": shown(value)}
        )
    return value


def _name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Count = Annotated[int, BeforeValidator(_integer), Field(le=COUNT_MAX)]
Int = Annotated[int, BeforeValidator(_integer), Field(ge=INT64_MIN, le=INT64_MAX)]  # sizes in bytes, say
Seed = Annotated[int, BeforeValidator(_integer), Field(ge=0, le=SEED_MAX)]
Real = Annotated[float, BeforeValidator(_real)]
Name = Annotated[str, AfterValidator(_name)]
