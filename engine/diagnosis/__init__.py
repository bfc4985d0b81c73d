"""Diagnosis of a run: a digest of the store, Claude with tools over it, and an offline analyst."""
