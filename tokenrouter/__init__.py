"""TokenRouter: serving and co-design simulation for token-level LLM routing."""

__version__ = "0.1.0"
