"""What a trajectory is worth: the five-signal reward (signals.py), the per-domain advantages, the domain
inference, the process fingerprint, and the plasticity triggers that say when to retrain."""
