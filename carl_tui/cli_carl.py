"""`python -m carl_tui.cli_carl` is `carl` (the headless CLI), for environments without the script."""

import sys

from .cli import main

sys.exit(main())
