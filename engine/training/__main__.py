"""`python -m engine.training --config carl.yaml ...`: one training run as its own process."""

from __future__ import annotations

import warnings

from .carl_train import main

if __name__ == "__main__":
    # Library deprecation notices (transformers 5 renames) are noise in a run's log.
    warnings.filterwarnings("ignore", category=FutureWarning)
    raise SystemExit(main())
