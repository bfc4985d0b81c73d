"""Language models the engine asks: `claude`, which Claude model, and an Anthropic client (the SDK is imported
only when one is made).

Diagnosis and the agents plane both use it; importing this package imports nothing heavy. What may be sent
to a model is redacted first by `engine.redact`, beside `engine.text`: the store, the alerts and the
trajectories redact too, and none of them talks to a model.
"""
