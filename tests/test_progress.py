import io

from glas_sklearn._progress import LOG_INTERVAL, progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_log_file_gets_few_updates():
    log = io.StringIO()
    for _ in progress(range(500), desc="work", file=log):
        pass
    # Opening and closing state only (the loop is far shorter than LOG_INTERVAL), not one write per step.
    writes = log.getvalue().count("\r")
    assert 1 <= writes <= 3, log.getvalue()
    assert "500/500" in log.getvalue()


def test_terminal_gets_live_bar_with_tqdm_defaults():
    bar = progress(range(3), file=_Terminal())
    assert bar.mininterval < LOG_INTERVAL
    bar.close()
    assert progress(range(3), file=io.StringIO()).mininterval == LOG_INTERVAL


def test_verbose_zero_is_silent():
    log = io.StringIO()
    for _ in progress(range(50), verbose=0, file=log):
        pass
    assert log.getvalue() == ""
