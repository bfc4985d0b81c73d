"""carl-tui engine: everything that is not drawing.

Store, observe, daemon, coherence and training live here. Nothing in this package imports
Textual or the TUI packages, and nothing imports torch at module level: heavy libraries are
imported inside the functions that need them, so the control room opens fast.
"""

__version__ = "0.1.0"
