"""The demo: the built-in run that `carl demo` and `carl-tui --demo` have the engine start (start.py,
carl_demo.py), and the offline observed demo, a short, real TRL GRPO run of the built-in tiny model,
observed through Trackio (trl_run.py, `python -m engine.demo`)."""
