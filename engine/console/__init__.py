"""A run's console: its log files (stdout and stderr of our runs, W&B's `files/output.log`, any file named
with `carl observe --log`), read by offsets and never whole, and scanned for what went wrong.

`logfile.py` reads a log file by offsets (the line index, a line's text, search), `problems.py` finds the
tracebacks, CUDA out-of-memory and NCCL errors in its bytes, `log_reader.py` is the log view's reader thread
(no Textual), `scan.py` reads a registered console incrementally into `console_findings`, and `console_job.py`
is the engine's job that knows which files are a run's console and scans them. docs/guide/console.md is the
user's page. Light on purpose: the log view loads it on first use, without the store's writer.
"""
