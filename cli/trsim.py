"""`trsim`: the co-design simulator's command line (CPU only)."""

from __future__ import annotations

from tokenrouter.cli import cost_cmd, estimate_cmd, model_cmd, run_cmd, sweep_cmd, tune_cmd, validate_cmd
from tokenrouter.cli.common import new_app, run_app

app = new_app("trsim", "Simulate token-level routing deployments (small + large model subservers) on a GPU profile.")
run_cmd.register(app)
sweep_cmd.register(app)
tune_cmd.register(app)
model_cmd.register(app)
cost_cmd.register(app)
validate_cmd.register(app)
estimate_cmd.register(app)


def main(argv: list[str] | None = None) -> None:
    run_app(app, "trsim", argv)


if __name__ == "__main__":
    main()
