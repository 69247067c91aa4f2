import pytest

from glas_sklearn.cli import main


def test_demo_quick_prints_table_and_writes_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["demo", "--quick", "--quiet", "--n-samples", "50", "--output-dir", str(tmp_path)]) == 0
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
