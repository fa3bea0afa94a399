"""`fp8mp.training.saved_tensors`, the path of fp8mp.memory.saved_tensors (saved_tensor_bytes) that code written
before it moved uses: the same objects."""
from fp8mp.memory.saved_tensors import *  # noqa: F401,F403
from fp8mp.memory.saved_tensors import __all__  # noqa: F401
