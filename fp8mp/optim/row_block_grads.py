"""Weight gradients handed to an optimizer a block of rows at a time, so that no whole gradient of a large
parameter is held (fp8mp.step_in_backward's row blocks).

An optimizer that steps parameters in backward (fp8mp/optim/step_in_backward.py) registers itself as the
`RowBlockSink` of its large parameters for the duration of its backward (`handing_rows_to`). A backward that
can compute a weight's gradient a block of rows at a time (fp8mp.nn.chunked_linear_cross_entropy's head,
fp8mp's FP8 Linear wgrad) asks `sink_of(weight)`; where there is one, it computes the rows
``[start, start + sink.block_rows(weight))``, hands each block to ``sink.take_rows(weight, start, rows)`` at
once, and returns no gradient for the weight (autograd then accumulates none: the sink has stepped it).

A block starts on a `STATE_BLOCK`-element boundary of the whole tensor (`rows_per_block`), so that the fused
ops step it as they step an FSDP2 shard (``element_offset``): the same stochastic-rounding bits and FP8 state
blocks as a step of the whole gradient.

The registry is keyed by the parameter itself (its identity), behind a lock: CUDA's autograd runs backward
functions in its own threads, where a context variable set by the caller would not be seen, and two models
training in two threads register disjoint parameters. A parameter registered twice at once is refused.
"""
from __future__ import annotations

import contextlib
import math
import threading
import weakref
from typing import Iterable, Protocol

import torch

from fp8mp.ops.optim import STATE_BLOCK

__all__ = ["RowBlockSink", "TokenRows", "handing_rows_to", "referenced", "rows_per_block", "sink_of",
           "weight_ref_for_row_blocks"]


class RowBlockSink(Protocol):
    """What takes a weight's gradient in row blocks."""

    def block_rows(self, weight: torch.Tensor) -> int:
        """Rows of each block of `weight`'s gradient (the last block may hold fewer)."""

    def take_rows(self, weight: torch.Tensor, row_start: int, grad_rows: torch.Tensor) -> None:
        """The gradient of ``weight[row_start:row_start + len(grad_rows)]``, in weight's dtype, contiguous. The
        sink may step those rows at once: a backward reads the weight's rows before it hands their gradient."""


_lock = threading.Lock()
_sinks: dict[int, tuple[torch.Tensor, RowBlockSink]] = {}


def weight_ref_for_row_blocks(weight: torch.Tensor) -> weakref.ref | None:
    """What a forward keeps to find its weight's sink in backward: a weak reference to the weight itself (a saved
    tensor may unpack as another object under saved-tensor hooks, and the registry knows the parameter by its
    identity); None while torch.compile traces (no row blocks there, and dynamo before torch 2.14 cannot branch
    on a weak reference)."""
    return None if torch.compiler.is_compiling() else weakref.ref(weight)


def referenced(weight_ref: weakref.ref | None) -> torch.Tensor | None:
    """The weight of `weight_ref_for_row_blocks`'s reference (None: no reference, or the weight is gone)."""
    return None if weight_ref is None else weight_ref()


def sink_of(weight: torch.Tensor | None) -> RowBlockSink | None:
    """The sink registered for this very tensor (None when none is, or while torch.compile traces)."""
    # An empty registry (no stepper's backward running: every other backward) is read without the lock.
    if weight is None or not _sinks or torch.compiler.is_compiling():
        return None
    with _lock:
        entry = _sinks.get(id(weight))
    return entry[1] if entry is not None and entry[0] is weight else None


@contextlib.contextmanager
def handing_rows_to(sink: RowBlockSink, params: Iterable[torch.Tensor]):
    """Register `sink` for `params` while the block runs (RuntimeError if one of them already has a sink)."""
    params = list(params)
    with _lock:
        for p in params:
            if id(p) in _sinks and _sinks[id(p)][0] is p:
                raise RuntimeError(f"fp8mp.optim.row_block_grads: a parameter of shape {list(p.shape)} already hands "
                                   "its gradient rows to another optimizer's backward; step it with one at a time")
        _sinks.update({id(p): (p, sink) for p in params})
    try:
        yield
    finally:
        with _lock:
            for p in params:
                _sinks.pop(id(p), None)


def rows_per_block(shape: torch.Size | tuple[int, ...], element_size: int, max_block_bytes: int) -> int:
    """Rows of the blocks of a gradient of `shape`: the most that fit `max_block_bytes`, rounded down to a
    multiple of the rows whose elements make whole STATE_BLOCK-element blocks (so that every block starts on a
    block boundary of the whole tensor); at least that many, at most all rows."""
    rows = shape[0]
    row_numel = math.prod(shape[1:])
    if rows == 0 or row_numel == 0:
        return max(rows, 1)
    align = STATE_BLOCK // math.gcd(STATE_BLOCK, row_numel)
    fit = max_block_bytes // (row_numel * element_size) // align * align
    return min(rows, max(align, fit))


class TokenRows:
    """A row-sparse gradient, one row of `values` per token id in `ids` (an embedding's: nn.Embedding's
    sparse gradient, or its output's gradient), made dense a block of rows at a time."""

    def __init__(self, ids: torch.Tensor, values: torch.Tensor):
        self.ids, self.order = ids.reshape(-1).sort(stable=True)
        self.values = values.reshape(self.ids.shape[0], -1)

    def dense_blocks(self, rows: int, block: int, row_shape: tuple[int, ...], dtype: torch.dtype):
        """(start, rows [start, start + block) of the dense gradient in `dtype`) for each block of `rows` rows, one
        at a time: each row the sum of its tokens' rows in fp32 (index_put_ with accumulate: one order of the
        sorted ids, the same bits on every call), rounded once; the rows of no token are zeros. One host sync
        for the blocks' bounds."""
        starts = list(range(0, rows, block))
        edges = torch.tensor([*starts, rows], device=self.ids.device)
        bounds = torch.searchsorted(self.ids, edges).tolist()
        for i, start in enumerate(starts):
            lo, hi = bounds[i], bounds[i + 1]
            dense = torch.zeros((min(start + block, rows) - start, *row_shape), dtype=torch.float32,
                                device=self.values.device)
            picked = self.values[self.order[lo:hi]].float().reshape(hi - lo, *row_shape)
            dense.index_put_((self.ids[lo:hi] - start,), picked, accumulate=True)
            rounded = dense.to(dtype)
            del dense, picked  # one block alive at a time: the caller drops it before asking for the next
            yield start, rounded
            del rounded
