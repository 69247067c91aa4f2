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


def _trained_like_loop(file, steps=400, **kwargs):
    """The training loop's use of the bar: one ``set_postfix`` per step, as in estimators/_training.py."""
    bar = progress(range(steps), desc="training", file=file, **kwargs)
    for step in bar:
        bar.set_postfix(loss=f"{1.0 / (step + 1):.4g}")
        bar.set_description(f"training {step}")
    bar.close()
    return file.getvalue()


def test_set_postfix_does_not_redraw_in_a_log():
    text = _trained_like_loop(io.StringIO())
    # Each redraw starts with a carriage return: the opening state, the closing state, nothing per step.
    assert 1 <= text.count("\r") <= 3, f"{text.count(chr(13))} redraws: {text[:300]!r}"
    assert "400/400" in text and "loss=0.0025" in text  # the last postfix is shown at close
    assert len(text) < 400  # one step would already cost a ~60-character line


def test_set_postfix_redraws_live_in_a_terminal():
    # The same loop in a terminal (with the minimum interval off) redraws on every postfix: the live bar is kept.
    text = _trained_like_loop(_Terminal(), mininterval=0)
    assert text.count("\r") >= 400
