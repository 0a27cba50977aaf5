"""Baselines the routed runtime is compared against, on the same engine, so a comparison isolates the serving layer
(docs/baselines.md): standard serving (`model_server`, `dispatcher`, `launcher`, with the prefix cache of
`radix_cache` and `kv`) and LLM-only / SLM-only. The prefix cache and the pool are pure Python; the servers need
the `engine` and `serve` extras and are imported only where they run.
"""
