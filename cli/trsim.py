"""`trsim`: the co-design simulator's command line (CPU only)."""

from __future__ import annotations

from tokenrouter.cli import cost_cmd, estimate_cmd, model_cmd, run_cmd, sweep_cmd, tune_cmd, validate_cmd
from tokenrouter.cli.common import new_app, run_app

app = new_app("trsim", "Simulate token-level routing deployments (small + large model subservers) on a GPU profile.")
app.command("run")(run_cmd.run)
app.command("sweep")(sweep_cmd.sweep)
app.command("tune")(tune_cmd.tune)
app.command("model")(model_cmd.model)
app.command("cost")(cost_cmd.cost)
app.command("validate")(validate_cmd.validate)
app.command("profile")(estimate_cmd.profile)


def main(argv: list[str] | None = None) -> None:
    run_app(app, "trsim", argv)


if __name__ == "__main__":
    main()
