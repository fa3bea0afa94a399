"""Layer memory, the levers that cut a training step's memory: FP8 storage of what norm and activation modules
save for backward (saved_activations.py) and of functional code's inputs (fp8_recompute.py), the LM-head loss a
chunk of tokens at a time (chunked_cross_entropy.py), an embedding's gradient a block of rows at a time
(embedding_grad_rows.py), and the count of the bytes a step saves (saved_tensors.py). May import fp8mp.utils,
fp8mp.ops, fp8mp.optim, fp8mp.scaling, fp8mp.quantized and fp8mp.functions; never fp8mp.nn or above."""
from fp8mp.memory.chunked_cross_entropy import chunked_linear_cross_entropy
from fp8mp.memory.embedding_grad_rows import embedding_grad_in_row_blocks, restore_embedding_grad
from fp8mp.memory.fp8_recompute import fp8_recompute
from fp8mp.memory.saved_activations import disable_fp8_saved_activations, enable_fp8_saved_activations
from fp8mp.memory.saved_tensors import saved_tensor_bytes

__all__ = ["chunked_linear_cross_entropy", "embedding_grad_in_row_blocks", "restore_embedding_grad", "fp8_recompute",
           "enable_fp8_saved_activations", "disable_fp8_saved_activations", "saved_tensor_bytes"]
