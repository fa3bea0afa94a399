"""`embedding_grad_in_row_blocks(embedding)`: an nn.Embedding whose weight gradient, when an optimizer steps the
weight in backward in row blocks (fp8mp.step_in_backward; fp8mp/optim/row_block_grads.py), is made dense a
block of rows at a time from its output's gradient, and never as a whole::

    fp8mp.nn.embedding_grad_in_row_blocks(model.get_input_embeddings())
    stepper = fp8mp.step_in_backward(optimizer)

Each block's rows are the sums of their tokens' output-gradient rows, in fp32, rounded once to the weight's
dtype; rows of no token are zeros (and are stepped: AdamW's moments decay, weight decay applies). The
output's gradient is autograd's anyway: what is held besides it is one block. Where no optimizer takes the
rows, backward returns the dense gradient of F.embedding's own backward. The forward is F.embedding's;
`padding_idx` is kept (its row gets no gradient); `max_norm`, `scale_grad_by_freq` and `sparse` are refused.
Not for a weight tied to another use (an LM head): its gradient would come in rows and whole.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from fp8mp.optim.row_block_grads import TokenRows, referenced, sink_of, weight_ref_for_row_blocks

__all__ = ["embedding_grad_in_row_blocks", "restore_embedding_grad"]


class _RowBlockEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, padding_idx):
        ctx.save_for_backward(ids)
        # The weight itself, for the row blocks' registry; its values are not needed
        ctx.weight_ref, ctx.weight_shape = weight_ref_for_row_blocks(weight), tuple(weight.shape)
        ctx.weight_dtype, ctx.padding_idx = weight.dtype, padding_idx
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_out):
        ids, = ctx.saved_tensors
        weight = referenced(ctx.weight_ref)
        sink = sink_of(weight)
        if sink is None:
            return None, torch.ops.aten.embedding_dense_backward(
                grad_out, ids, ctx.weight_shape[0], -1 if ctx.padding_idx is None else ctx.padding_idx, False), None
        ids = ids.reshape(-1)
        values = grad_out.reshape(ids.shape[0], -1)
        if ctx.padding_idx is not None:  # that row takes no gradient, as F.embedding's backward
            keep = ids != ctx.padding_idx
            ids, values = ids[keep], values[keep]
        blocks = TokenRows(ids, values).dense_blocks(ctx.weight_shape[0], sink.block_rows(weight),
                                                     ctx.weight_shape[1:], ctx.weight_dtype)
        for start, rows in blocks:
            sink.take_rows(weight, start, rows)
            del rows
        return None, None, None


def _forward(self, input):
    return _RowBlockEmbedding.apply(input, self.weight, self.padding_idx)


def embedding_grad_in_row_blocks(embedding: torch.nn.Embedding) -> torch.nn.Embedding:
    """Make `embedding`'s backward hand its weight gradient in row blocks (module docstring); returns it.
    `restore_embedding_grad` undoes it."""
    name = "fp8mp.nn.embedding_grad_in_row_blocks"
    if type(embedding) is not torch.nn.Embedding:
        raise TypeError(f"{name}: argument 'embedding' must be a torch.nn.Embedding, got {type(embedding).__name__}")
    if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
        raise ValueError(f"{name}: argument 'embedding' sets max_norm, scale_grad_by_freq or sparse; it takes an "
                         "embedding without them")
    if "forward" in vars(embedding):
        raise RuntimeError(f"{name}: argument 'embedding' has its own forward already")
    embedding.forward = types.MethodType(_forward, embedding)  # an instance attribute: the class is untouched
    return embedding


def restore_embedding_grad(embedding: torch.nn.Embedding) -> torch.nn.Embedding:
    """Undo embedding_grad_in_row_blocks: nn.Embedding's own forward again."""
    if vars(embedding).get("forward") is None or vars(embedding)["forward"].__func__ is not _forward:
        raise RuntimeError("fp8mp.nn.restore_embedding_grad: argument 'embedding' does not hand its gradient in row "
                           "blocks")
    del embedding.forward
    return embedding
