"""Moved to `tokenrouter.plots` (shared by `trsim run --plot` and `tr bench --plot`); kept as an alias."""

from tokenrouter.plots import plot_run, plot_sweep

__all__ = ["plot_run", "plot_sweep"]
