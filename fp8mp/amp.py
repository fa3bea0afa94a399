"""`fp8mp.amp`, fp8mp.training.loss_scaler (LossScaler) under the path that code written before the layered
layout uses: the same objects."""
from fp8mp.training.loss_scaler import *  # noqa: F401,F403
from fp8mp.training.loss_scaler import __all__  # noqa: F401
