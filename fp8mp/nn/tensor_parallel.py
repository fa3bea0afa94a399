"""`fp8mp.nn.tensor_parallel`, the documented path of the tensor-parallel styles of fp8mp.parallel.tensor_parallel
(Fp8ColwiseParallel, Fp8RowwiseParallel): the same objects."""
from fp8mp.parallel.tensor_parallel import *  # noqa: F401,F403
from fp8mp.parallel.tensor_parallel import __all__  # noqa: F401
