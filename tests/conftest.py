import os
import signal
import sys
import threading

import pytest

# The shared test helpers (fp8_reference.py, opcheck_util.py, ...) live here, beside the per-layer folders.
sys.path.insert(0, os.path.dirname(__file__))


def pytest_collection_modifyitems(config, items):
    # Every test function with "cuda" in its name carries the `cuda` marker, so `pytest -m cuda`
    # (benchmarks/gpu_check.sh) selects all GPU tests even where a file forgot the marker. The function's
    # name, not a parametrized id: a CPU test of a path such as fp8mp/_cuda_ops.abi3.so is no GPU test.
    for item in items:
        if "cuda" in getattr(item, "originalname", item.name).lower():
            item.add_marker(pytest.mark.cuda)


# A per-test time limit without pytest-timeout (absent on the lent GPU machine): FP8MP_TEST_TIMEOUT=<seconds>
# (benchmarks/gpu_check.sh sets it) makes a test that runs longer fail with TimeoutError, and the run goes on.
# SIGALRM interrupts Python code only; a kernel hung inside C++ is left to the step's own `timeout`.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    seconds = int(os.environ.get("FP8MP_TEST_TIMEOUT", "0") or 0)
    if seconds <= 0 or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"{item.nodeid} ran longer than FP8MP_TEST_TIMEOUT={seconds}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
