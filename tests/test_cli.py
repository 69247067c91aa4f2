import re

import numpy as np
import pytest

from glas_sklearn.cli import main


def test_demo_quick_prints_intervals_coverage_and_writes_a_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["demo", "--quick", "--quiet", "--rows", "5", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "UCI concrete: 1030 rows" in out and "824 rows to fit, 206 held out" in out
    assert "training=Training(max_epochs=30), posterior=LowRank(max_components=10)" in out  # how a quick run differs
    assert "y_bounds=(0, None)" in out
    # the summary names the calibration the estimator used, and the noise model it kept
    assert "calibration='mondrian'" in out and "split-conformal" not in out
    assert "noise level" in out
    # the interval table: 5 rows of y, prediction, lower, upper, inside, each inside flag agreeing with its bounds
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["y", "(MPa)"]) + 1
    table = [line.split() for line in lines[start:start + 5]]
    assert all(len(row) == 5 for row in table)
    for y, _, lower, upper, inside in table:
        assert 0.0 <= float(lower) < float(upper)  # y_bounds=(0, None): a strength is never negative
        assert inside == str(float(lower) <= float(y) <= float(upper)) or abs(float(y) - float(lower)) < 0.1 \
            or abs(float(y) - float(upper)) < 0.1  # printed with one decimal
    # coverage of the held-out rows at both levels, as shares in [0, 1] and widths ordered with the level
    found = re.findall(r"(\d+)% intervals: coverage ([\d.]+)%, mean width ([\d.]+) MPa", out)
    assert [level for level, _, _ in found] == ["50", "90"]
    coverages = np.array([float(c) for _, c, _ in found])
    widths = np.array([float(w) for _, _, w in found])
    assert np.all((coverages >= 0) & (coverages <= 100)) and widths[0] < widths[1]
    png = tmp_path / "intervals.png"
    assert f"plot: {png.resolve()}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paper_demo_quick_prints_table_and_writes_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["demo", "--paper", "--quick", "--quiet", "--n-samples", "50", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "UCI concrete" in out
    for column in ("d", "sigma0", "cal. coverage", "test coverage", "mean width (MPa)", "RMSE (MPa)", "wall s"):
        assert column in out
    lines = [row for row in (line.split() for line in out.splitlines())
             if len(row) > 1 and row[0] in ("mean", "standard") and row[1].isdigit()]
    assert [row[0] for row in lines] == ["mean", "standard"]
    assert 1 <= int(lines[0][1]) <= 10 and 1 <= int(lines[1][1]) <= 10
    assert (tmp_path / "coverage_vs_d.png").stat().st_size > 0
    assert (tmp_path / "parity_intervals.png").stat().st_size > 0


def test_unknown_command_exits():
    with pytest.raises(SystemExit):
        main(["nonsense"])
