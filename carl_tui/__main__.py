"""`python -m carl_tui` is `carl-tui`."""

import sys

from .launch import tui_main

sys.exit(tui_main())
