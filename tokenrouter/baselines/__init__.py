"""Baselines the routed runtime is compared against, on the same engine, so a comparison isolates the serving layer.

- Standard serving (`baseline: std-serving` in a config, `tr serve --baseline std-serving`): one
  continuous-batching server per model with a prefix cache (`radix_cache`, `kv`), and an external dispatcher that
  runs the router and sends every hop to the other model as a new request carrying the whole sequence
  (`model_server`, `dispatcher`, `launcher`).
- LLM-only and SLM-only (`--baseline llm-only | slm-only`): one such server for one model, no routing.

The prefix cache and the pool (`radix_cache`, `kv`) are pure Python; the servers need the `engine` and `serve`
extras and are imported only where they run. See docs/baselines.md.
"""
