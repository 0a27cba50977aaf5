"""`tr bench`: a load generator for a running TokenRouter (or any OpenAI-compatible) server."""
