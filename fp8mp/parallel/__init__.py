"""Layer parallel, fp8mp under torch.distributed beyond data parallel: Linear on the local shards of a
tensor-parallel layer (sharded_linear.py), the tensor-parallel styles (tensor_parallel.py: import it by its path;
it needs torch.distributed.tensor.parallel), and the whole training state through torch.distributed.checkpoint,
saved on N ranks and loaded on M (distributed_checkpoint.py). May import every layer up to fp8mp.memory, never
fp8mp.nn or above (an fp8mp module is recognised by its Fp8Meta, not by its class)."""
from fp8mp.parallel.distributed_checkpoint import TrainingState, load_checkpoint, save_checkpoint

__all__ = ["TrainingState", "save_checkpoint", "load_checkpoint"]
