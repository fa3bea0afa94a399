"""`fp8mp.recipe`, the documented short path of fp8mp.scaling.recipe (the FP8 recipes): the same objects."""
from fp8mp.scaling.recipe import *  # noqa: F401,F403
from fp8mp.scaling.recipe import __all__  # noqa: F401
