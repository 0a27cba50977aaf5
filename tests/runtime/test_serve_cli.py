"""`tr serve` without starting processes: the resolved deployment, one-line user errors."""

from __future__ import annotations

import subprocess
import sys

import yaml


def tr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenrouter.cli.tr", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_dry_run_resolves_flags_over_the_config(tmp_path):
    from tokenrouter.core.config import DeploymentConfig, ModelConfig, PolicyConfig

    path = tmp_path / "serve.yaml"
    DeploymentConfig(models=[ModelConfig("tiny-small"), ModelConfig("tiny-large")],
                     policy=PolicyConfig(kind="delayed", thresholds=[2, 1])).save(path)  # fmt: skip
    r = tr("serve", "--config", str(path), "--device", "cpu", "--policy", "step-sync", "--router-model", "random",
           "--hop-rate", "0.2", "--no-overlap", "--dry-run")  # fmt: skip
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert cfg["policy"]["kind"] == "step-sync" and cfg["policy"]["thresholds"] == [2, 1]
    assert cfg["router"]["weights"] == "random" and cfg["router"]["hop_rate"] == 0.2
    assert cfg["scheduler"]["overlap"] is False


def test_user_errors_are_one_line_exit_2(tmp_path):
    for args in (["serve", "--device", "cpu"], ["serve", "--small", "tiny-small", "--large", "tiny-large",
                                                "--hop-rate", "2", "--device", "cpu"]):  # fmt: skip
        r = tr(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
