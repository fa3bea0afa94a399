import os
import signal
import sys
import threading

import pytest

# The shared test helpers (fp8_reference.py, opcheck_util.py, ...) live here, beside the per-layer folders.
sys.path.insert(0, os.path.dirname(__file__))


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist's N worker processes, each worker (and what it starts: examples, torchrun, process
    pools, through OMP_NUM_THREADS) takes cores / N threads. torch's default of one thread a core in every
    worker oversubscribes the cores, and OpenMP's spin-waits then stall: a set of test files that takes 57 s
    with one thread a worker took 468 s with two on a 2-core machine. An OMP_NUM_THREADS of the caller's is
    kept; tests that need other thread counts set them themselves."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


_share_the_cores_between_workers()


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
