"""`fp8mp.nn.saved_activations`, the path of fp8mp.memory.saved_activations (FP8 storage of what norm and
activation modules save for backward) that code written before it moved uses: the same objects."""
from fp8mp.memory.saved_activations import *  # noqa: F401,F403
from fp8mp.memory.saved_activations import __all__  # noqa: F401
