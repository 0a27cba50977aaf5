"""Model shapes shared by the engine, the cost model and the simulator (pure: no torch)."""

from tokenrouter.models.spec import ModelSpec, bundled_model_names, load_spec

__all__ = ["ModelSpec", "bundled_model_names", "load_spec"]
