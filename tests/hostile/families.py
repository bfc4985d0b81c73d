"""Every family of the suite, by name, in the order the bench runs them."""

from __future__ import annotations

from hostile import config_families, observe_families, plane_families, serve_family, trajectory_families
from hostile.runner import Family

GROUPS: dict[str, list[Family]] = {
    "observe": observe_families.FAMILIES,
    "trajectories": trajectory_families.FAMILIES,
    "configs": config_families.FAMILIES,
    "plane": plane_families.FAMILIES,
    "serve": serve_family.FAMILIES,
}
FAMILIES: dict[str, Family] = {family.name: family for group in GROUPS.values() for family in group}

# Families whose printed output still holds raw control bytes where the command prints a stored name, a path
# or a problem line as it is: visible() at every print site is issue 22 §5's work (branch r22-terminal). Their
# CI test counts such lines and is marked xfail for them alone; every other check of theirs stays strict.
# Empty this set once that work is merged.
AWAITING_VISIBLE = frozenset(
    {
        *(family.name for family in observe_families.FAMILIES),
        *(family.name for family in trajectory_families.FAMILIES),
        *(family.name for family in config_families.FAMILIES),
    }
)
