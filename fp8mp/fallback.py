"""`fp8mp.fallback`, the documented short path of fp8mp.training.fallback (FallbackPolicy): the same objects."""
from fp8mp.training.fallback import *  # noqa: F401,F403
from fp8mp.training.fallback import __all__  # noqa: F401
