import os
import sys

import pytest

# The shared test helpers (fp8_reference.py, opcheck_util.py, ...) live here, beside the per-layer folders.
sys.path.insert(0, os.path.dirname(__file__))


def pytest_collection_modifyitems(config, items):
    # Every test with "cuda" in its name carries the `cuda` marker, so `pytest -m cuda`
    # (benchmarks/gpu_check.sh) selects all GPU tests even where a file forgot the marker.
    for item in items:
        if "cuda" in item.name.lower():
            item.add_marker(pytest.mark.cuda)
