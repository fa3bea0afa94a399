"""`fp8mp.distributed`, fp8mp.scaling.distributed (amax reduction across ranks) under the path that code
written before the layered layout uses: the same objects."""
from fp8mp.scaling.distributed import *  # noqa: F401,F403
from fp8mp.scaling.distributed import __all__  # noqa: F401
