"""Plain `python` commands under the GPU check's imports: with this folder first on PYTHONPATH, every Python
process (fresh child processes of a benchmark included) imports benchmarks/gpu_image_imports.py at start-up, so
what the GPU machine is not sure to hold raises ModuleNotFoundError, as it would there (gpu_check.sh --dry-run)."""
import importlib.util
import os
import sys

_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu_image_imports.py")
_spec = importlib.util.spec_from_file_location("gpu_image_imports", _path)
_module = importlib.util.module_from_spec(_spec)
sys.modules["gpu_image_imports"] = _module
_spec.loader.exec_module(_module)
