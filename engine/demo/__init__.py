"""The offline demo: a short, real TRL GRPO run of the built-in tiny model, observed through Trackio."""
