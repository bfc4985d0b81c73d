"""Agent session traces from disk: Claude Code transcripts, Codex rollouts, KARL record files.

files.py is the front door (`import_paths`), one module per format, common.py what they share, and
detect.py which user lines are human prompts and what they say about the previous turn.
"""
