"""carl-tui: the Textual control room. Imports no torch, transformers, trl, peft or mlx."""

__version__ = "0.1.0"
