"""Agent session traces from disk: Claude Code transcripts, Codex rollouts, KARL record files.

trace_files.py is the front door (`import_paths`), one module per format, trace_lines.py what they share, and
human_prompts.py which user lines are human prompts and what they say about the previous turn.
"""
