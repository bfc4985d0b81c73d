"""Trajectory intelligence: agent session traces, the 5-signal reward, domain advantages, training data."""
