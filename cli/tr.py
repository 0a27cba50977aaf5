"""`tr`: the serving side's command line (docs/cli.md). It shadows coreutils `tr` in an activated venv, so the same
app is installed as `tokenrouter` too; scripts, tests and CI call that one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tokenrouter.cli import bench_cmd
from tokenrouter.cli.calibrate_cmd import calibrate
from tokenrouter.cli.common import new_app, run_app
from tokenrouter.cli.link_cmd import link_probe
from tokenrouter.cli.serve_cmd import serve
from tokenrouter.cli.subserver_cmd import subserver
from tokenrouter.core.config import load_config
from tokenrouter.deploy.builder import max_context_len
from tokenrouter.deploy.summary import describe_deployment
from tokenrouter.models import bundled_model_names, load_spec

app = new_app("tr", "TokenRouter serving tools.")
app.command("serve")(serve)
app.command("calibrate")(calibrate)
app.command("subserver")(subserver)
app.command("link-probe")(link_probe)


@app.command("models")
def models() -> None:
    """List the bundled model shapes: parameters, weight bytes, KV bytes per token; models that ship a
    tokenizer (the tiny CPU test models) are named below the table."""
    t = Table(title="bundled model configs (bf16)")
    for col in ("model", "params", "weights GB", "KV KiB/token", "layers", "heads q/kv", "tied"):
        t.add_column(col, justify="left" if col == "model" else "right")
    with_tokenizer: dict[str, str] = {}
    for s in sorted((load_spec(n) for n in bundled_model_names()), key=lambda s: s.num_params):
        n = s.num_params
        t.add_row(s.name, f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M",
                  f"{s.weight_bytes / 1e9:.2f}" if n >= 1e8 else f"{s.weight_bytes / 1e9:.4f}",
                  f"{s.kv_bytes_per_token / 1024:.{0 if s.kv_bytes_per_token >= 1024 else 2}f}", str(s.num_layers),
                  f"{s.num_heads}/{s.num_kv_heads}", "yes" if s.tie_word_embeddings else "no")  # fmt: skip
        if (s.raw or {}).get("tokenizer"):
            with_tokenizer[s.name] = str(s.raw["tokenizer"])
    c = Console()
    c.print(t)
    for name, tok in with_tokenizer.items():
        c.print(f"{name}: ships the bundled tokenizer {tok!r} (CPU serving with dummy weights)")


@app.command("check-config")
def check_config(path: Annotated[Path, typer.Argument(help="Deployment YAML (from `trsim tune`).")]) -> None:
    """Validate a deployment config and print what it deploys."""
    cfg = load_config(path)
    max_context_len(cfg)  # every model's spec loads, and max_model_len is within their context
    typer.echo("\n".join([f"{path}: ok", *describe_deployment(cfg, baseline=cfg.baseline)]))


app.command("bench")(bench_cmd.bench)


def main(argv: list[str] | None = None) -> None:
    run_app(app, "tr", argv)


def main_tokenrouter(argv: list[str] | None = None) -> None:
    """The `tokenrouter` console script: the same app as `tr`, under a name no system tool uses."""
    run_app(app, "tokenrouter", argv)


if __name__ == "__main__":
    main()
