"""studies/serving/curve/merge.py: one curve from several runs' cells, the first run's cell kept on a clash."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from study_script import load_study


@pytest.fixture(scope="module")
def mod():
    return load_study("studies/serving/curve/merge.py")


def _run(tmp_path: Path, name: str, cells: list[tuple[str, int, int, float]]) -> Path:
    d = tmp_path / name
    d.mkdir()
    rows = [{"server": s, "N": n, "max_output": o, "output_throughput_tok_s": t, "sim_output_throughput_tok_s": t,
             "tpot_ms_p50": 1000.0 / t} for s, n, o, t in cells]  # fmt: skip
    pd.DataFrame(rows).to_csv(d / "curve.csv", index=False)
    return d


def test_first_run_wins_a_clash_and_ratios_use_the_kept_cells(mod, tmp_path):
    a = _run(tmp_path, "a", [("routed", 8, 256, 1500.0), ("std-serving", 8, 256, 1000.0)])
    b = _run(tmp_path, "b", [("routed", 8, 256, 1600.0), ("std-serving", 8, 256, 800.0),
                             ("routed", 8, 8192, 1200.0), ("routed", 64, 256, 4400.0)])  # fmt: skip
    out = tmp_path / "m"
    assert mod.main([str(a), str(b), "--out", str(out)]) == 0
    df = pd.read_csv(out / "curve.csv")
    assert len(df) == 4  # b's two N = 8 short cells dropped
    kept = df[(df.server == "routed") & (df.N == 8) & (df.max_output == 256)].iloc[0]
    assert (kept.run, kept.output_throughput_tok_s) == ("a", 1500.0)
    keys = json.loads((out / "curve.json").read_text())
    assert keys["min_ratio_vs_std_4_64"] == pytest.approx(1.5)  # a's pair, not 1600 / 800
    assert keys["long_output_ratio"] == pytest.approx(1200.0 / 1500.0)
    assert keys["n64_tok_s"] == 4400.0 and keys["cells"]["routed/64/256"] == "b"
    assert (out / "curve.png").stat().st_size > 0


def test_a_folder_without_a_curve_is_a_clear_error(mod, tmp_path):
    with pytest.raises(SystemExit, match=r"no curve\.csv"):
        mod.main([str(tmp_path), "--out", str(tmp_path / "m")])
