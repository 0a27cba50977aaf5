"""Baselines the routed runtime is compared against on the same engine (docs/baselines.md)."""
