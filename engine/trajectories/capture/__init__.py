"""Live capture of Claude Code sessions: the hook recorder (recorder.py, standard library only, run by every
hook event), the hooks' settings, spool and turn assembly (hooks.py), and the engine's ingest (live.py).

Empty on purpose: `carl hook` imports the recorder through this package, and the recorder runs on every
agent event.
"""
