"""The hostile-input suite, serve families (tests/hostile/__init__.py): each family's CI cases pass the
oracle."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hostile.families import GROUPS
from hostile.oracle import Tally
from hostile.runner import Family


@pytest.mark.parametrize("family", GROUPS["serve"], ids=lambda family: family.name)
def test_hostile_inputs(family: Family, run_ci: Callable[[Family], Tally]) -> None:
    tally = run_ci(family)
    assert tally.inputs >= family.ci_examples and tally.tracebacks == tally.hangs == tally.lost == 0
