"""Suite-wide fixtures: torch's intra-op thread count is pinned for every test.

The tests use tiny networks, where one thread is faster than two on a shared machine and avoids
oversubscription. ``GLAS_TEST_THREADS`` overrides the pin: a number pins that many threads, ``default``
leaves torch's own choice (``.ci/run`` runs the suite a second time that way, so rounding that depends on
the thread count shows up in CI rather than on a user's machine).
"""

import os

import pytest
import torch


def _pinned_threads() -> int | None:
    value = os.environ.get("GLAS_TEST_THREADS", "1").strip().lower()
    if value in ("default", "", "none"):
        return None
    try:
        n = int(value)
    except ValueError:
        raise pytest.UsageError(f"GLAS_TEST_THREADS must be a positive integer or 'default', got {value!r}.") from None
    if n < 1:
        raise pytest.UsageError(f"GLAS_TEST_THREADS must be a positive integer or 'default', got {value!r}.")
    return n


@pytest.fixture(autouse=True, scope="session")
def pinned_intra_op_threads():
    """Every test runs with ``GLAS_TEST_THREADS`` intra-op threads (1 unless overridden); restored afterwards."""
    n = _pinned_threads()
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    yield n
    torch.set_num_threads(before)


def pytest_report_header(config):
    n = _pinned_threads()
    return f"torch intra-op threads: {'torch default (' + str(torch.get_num_threads()) + ')' if n is None else n}"
