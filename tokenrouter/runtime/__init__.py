"""The serving runtime (docs/runtime.md). Imports nothing heavy at package level."""
