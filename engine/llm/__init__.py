"""Language models the engine asks, and what may be sent to them.

- `redact`: secrets out of text before it leaves the machine (Claude, a remote judge) or enters the store;
- `claude`: which Claude model, and an Anthropic client (the SDK is imported only when one is made).

Diagnosis and the agents plane both use these; importing this package imports nothing heavy.
"""
