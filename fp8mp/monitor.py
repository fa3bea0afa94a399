"""`fp8mp.monitor`, the documented short path of fp8mp.training.monitor (the numerics monitor): the same objects."""
from fp8mp.training.monitor import *  # noqa: F401,F403
from fp8mp.training.monitor import __all__  # noqa: F401
