"""`python -m engine.agents manager|worker|trainer ...`: one process of the agents plane."""

from __future__ import annotations

import warnings

from .roles import main

if __name__ == "__main__":
    warnings.filterwarnings("ignore", category=FutureWarning)  # library renames are noise in a role's log
    raise SystemExit(main())
