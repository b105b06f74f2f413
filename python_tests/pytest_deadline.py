"""pytest plugin: time limits for a session that runs under a hard wall-clock limit.

    python3 -m pytest -p python_tests.pytest_deadline --stop-after 300 --per-test-timeout 150 ...

``--stop-after SECONDS``: after SECONDS from the session's start no further test starts; the
test running at that moment finishes, and the session ends as interrupted (exit code 2) with
its usual summary, JUnit XML and benchmark JSON written, so a run under a hard limit
(``scripts/gpu_check.sh`` on a lent GPU) still reports what it did.

``--per-test-timeout SECONDS``: a test (setup, call and teardown) that runs longer fails, and
the session goes on. Where pytest-timeout is installed (the GPU machine) the test gets
pytest-timeout's ``timeout`` marker (signal method) unless it has its own; without it (CI need
not have it) a SIGALRM timer here does the same. Either way the failure reads
``Timeout (>SECONDSs) from ...``. Like pytest-timeout's signal method, this interrupts Python
code; a call stuck inside C code is ended by the caller's outer ``timeout`` instead.

Without the options nothing changes.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

_START = pytest.StashKey[float]()
FALLBACK_MESSAGE = "Timeout (>{:g}s) from pytest_deadline."


def pytest_addoption(parser):
    group = parser.getgroup("deadline", "time limits (python_tests/pytest_deadline.py)")
    group.addoption(
        "--stop-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no test after SECONDS of the session; it then ends as interrupted, "
        "with its summary",
    )
    group.addoption(
        "--per-test-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail a test that runs longer than SECONDS (through pytest-timeout where it is "
        "installed, else a SIGALRM timer)",
    )


def _uses_pytest_timeout(config) -> bool:
    return config.pluginmanager.hasplugin("timeout")


def _fallback_timeout(config) -> float | None:
    """The per-test limit this plugin enforces itself: only without pytest-timeout, and only
    where SIGALRM exists."""
    limit = config.getoption("per_test_timeout")
    if not limit or limit <= 0 or _uses_pytest_timeout(config) or not hasattr(signal, "SIGALRM"):
        return None
    return limit


def pytest_sessionstart(session):
    session.config.stash[_START] = time.monotonic()


def pytest_report_header(config):
    limit = config.getoption("per_test_timeout")
    if not limit:
        return None
    how = "pytest-timeout, signal method" if _uses_pytest_timeout(config) else "SIGALRM fallback"
    return f"per-test timeout: {limit:g} s ({how})"


def pytest_collection_modifyitems(config, items):
    limit = config.getoption("per_test_timeout")
    if not limit or not _uses_pytest_timeout(config):
        return
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit, method="signal"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    limit = item.config.getoption("stop_after")
    if limit is None:
        return None
    if time.monotonic() - item.config.stash[_START] < limit:
        return None
    # Returning True runs and reports nothing for this item; the main loop then stops.
    item.session.shouldstop = f"--stop-after {limit:g} s spent; not run from {item.nodeid}"
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    # The timer covers setup, call and teardown (as pytest-timeout's default does): it starts
    # here and is cancelled after teardown.
    limit = _fallback_timeout(item.config)
    if limit is not None and threading.current_thread() is threading.main_thread():

        def expired(signum, frame):
            __tracebackhide__ = True
            signal.setitimer(signal.ITIMER_REAL, 0)
            pytest.fail(FALLBACK_MESSAGE.format(limit), pytrace=True)

        item.stash[_PREVIOUS] = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, limit)
    yield


_PREVIOUS = pytest.StashKey[object]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if _PREVIOUS in item.stash:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, item.stash[_PREVIOUS])
        del item.stash[_PREVIOUS]
