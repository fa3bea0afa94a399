"""`step_in_backward(optimizer)`: fp8mp.optim.AdamW / Lion step each parameter as soon as its gradient is
accumulated in backward, and free that gradient at once, so that no full gradient buffer lives (2 bytes a
parameter with bf16 parameters, 4 with fp32 ones)::

    stepper = fp8mp.step_in_backward(optimizer, scaler=scaler)     # scaler optional
    for batch in loader:
        with fp8mp.fp8_autocast():
            loss = model(batch).loss
        stepper.backward(loss)            # instead of backward(), scaler.step(optimizer), optimizer.zero_grad()
        scaler.update()

Each parameter gets a `Tensor.register_post_accumulate_grad_hook` (the pattern of torch's "optimizer step in
backward" tutorial), which runs the optimizer's fused op on that one parameter (`FusedOptimizer._step_parameter`,
the same op and arguments as `optimizer.step()`) and sets its `.grad` to None.

**Non-finite steps.** `optimizer.step()` skips a step whose gradients hold an Inf or a NaN (and LossScaler one
whose FP8 casts met one) as a whole: no parameter moves. In backward, the parameters whose gradients come
first have been stepped when a later gradient shows the Inf; undoing them needs their previous values and
states (4.06 bytes a parameter for bf16 parameters with FP8 AdamW states, more than the 2-byte gradient that
the step in backward saves). So when a step can be skipped (the optimizer's `skip_nonfinite`, or a `scaler`),
`backward` runs backward twice over one graph: the first pass only checks each gradient (the same checks, in
the same order, as the scaler and the optimizer: unscale with the scaler's scale and its Inf/NaN check, then
the optimizer's min/max check) and frees it; after one device->host sync of the flag (and of the FP8 casts'
flags, with a scaler), the second pass steps every parameter, or, on a skipped step, only frees the gradients
again. It costs one more backward pass (compute, no memory: the saved tensors are held until the second pass,
which is where a plain backward holds them too). The two passes compute the same gradients (the backward of
fp8mp's FP8 layers is deterministic, and what it records, the amax of each gradient cast, is a maximum: the
same after two passes as after one), so the parameters and states take the bits of `optimizer.step()`.
`verify=False` runs one pass and steps at once; it is refused unless nothing can skip a step (an optimizer
built with `skip_nonfinite=False` and no scaler): the torchtune way, where a non-finite gradient is stepped.

**Refused**: gradient accumulation over micro-batches (a parameter that already holds a `.grad` when `backward`
starts: accumulate with `optimizer.step()` instead, which keeps the buffer), global-norm gradient clipping
(`clip_grad_norm_` raises: the norm needs every gradient before the first step), a backward that does not go
through `stepper.backward` while the hooks are on (`remove()` takes them off).

**Row blocks.** A parameter whose gradient is larger than `max_grad_block_bytes` (default 1 MiB) is stepped a
block of rows at a time where its gradient can be produced so (fp8mp/optim/row_block_grads.py): the LM head
of fp8mp.nn.chunked_linear_cross_entropy (its backward by vocabulary rows), the weights of fp8mp's FP8 Linear
layers (their wgrad GEMM by output rows), an nn.Embedding after fp8mp.nn.embedding_grad_in_row_blocks (its
gradient made dense a block of rows at a time from its output's gradient), and an `nn.Embedding(...,
sparse=True)`, whose sparse gradient (the [tokens, hidden] rows of the tokens seen) is made dense here a block
of rows at a time the same way (each row the sum of its tokens' rows in fp32, rounded once; the rows of tokens
not seen are zeros and step as well: their moments decay, weight decay applies). Each block starts on a 128-element boundary of the whole tensor and is checked, unscaled and
stepped at once as a shard of it would be (`element_offset`): the same bits as a step of the whole gradient,
with the `step` counter advanced once. So what is held at once is a block, not the whole gradient of the
head or the embedding; `peak_grad_bytes` counts the blocks (and a sparse gradient's rows and indices).

Checkpoints are the optimizer's own `state_dict()`: a stepper holds no state, so a resumed run builds a new
one on the loaded optimizer and continues bit for bit.
"""
from __future__ import annotations

import contextlib

import torch

from fp8mp.optim import row_block_grads, sharding
from fp8mp.optim.fused import FusedOptimizer
from fp8mp.ops.optim import STATE_BLOCK
from fp8mp.utils.dtensor import is_dtensor

__all__ = ["StepInBackward", "step_in_backward"]

_CHECK, _STEP, _DISCARD = "check", "step", "discard"
DEFAULT_GRAD_BLOCK_BYTES = 2**20


class StepInBackward:
    """The handle `step_in_backward` returns (module docstring). Attributes after each `backward`:
    `stepped` (False when the step was skipped), `peak_grad_bytes` (the most bytes of `.grad` held at once
    during it)."""

    def __init__(self, optimizer: FusedOptimizer, scaler=None, verify: bool | None = None,
                 max_grad_block_bytes: int | None = DEFAULT_GRAD_BLOCK_BYTES):
        if not isinstance(optimizer, FusedOptimizer):
            raise TypeError("fp8mp.step_in_backward: argument 'optimizer' must be an fp8mp.optim.AdamW or Lion "
                            f"(a FusedOptimizer), got {type(optimizer).__name__}")
        if scaler is not None and not callable(getattr(scaler, "record_checked_step", None)):
            raise TypeError(f"fp8mp.step_in_backward: argument 'scaler' must be an fp8mp.LossScaler, got "
                            f"{type(scaler).__name__}")
        if max_grad_block_bytes is not None and (isinstance(max_grad_block_bytes, bool) or not isinstance(
                max_grad_block_bytes, int) or max_grad_block_bytes < 1):
            raise ValueError("fp8mp.step_in_backward: argument 'max_grad_block_bytes' must be an int >= 1 (bytes of "
                             f"gradient a row block holds) or None (no row blocks), got {max_grad_block_bytes!r}")
        self.max_grad_block_bytes = max_grad_block_bytes
        self.optimizer = optimizer
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        can_skip = optimizer.skip_nonfinite or self.scaler is not None
        self.verify = can_skip if verify is None else bool(verify)
        if can_skip and not self.verify:
            raise ValueError("fp8mp.step_in_backward: argument 'verify' is False, but a step with a non-finite "
                             "gradient must be skipped whole (the optimizer's skip_nonfinite, or a scaler): one pass "
                             "would have stepped the parameters whose gradients came before the Inf. Build the "
                             "optimizer with skip_nonfinite=False and pass no scaler to step without checks")
        self.stepped = True
        self.peak_grad_bytes = 0
        self._phase: str | None = None
        self._groups: dict[int, dict] = {}
        self._found: torch.Tensor | None = None
        self._held = 0
        params = {id(p): p for group in optimizer.param_groups for p in group["params"] if p.requires_grad}
        if any(is_dtensor(p) for p in params.values()):
            raise ValueError("fp8mp.step_in_backward: argument 'optimizer' holds DTensor parameters (FSDP2, tensor "
                             "parallel); the step in backward runs on unsharded parameters only: call "
                             "optimizer.step() after backward there")
        self._hooked = set(params)
        # Row blocks for the large parameters whose row slices are contiguous shards of them (module docstring).
        self._row_blocked = [] if max_grad_block_bytes is None else [
            p for p in params.values() if p.dim() >= 1 and p.is_contiguous()
            and p.numel() * p.element_size() > max_grad_block_bytes]
        self._rows_taken: dict[int, int] = {}
        self._whole: set[int] = set()
        self._counters: dict[int, torch.Tensor] = {}
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in params.values()]

    # ----------------------------------------------------------------------------- the hook
    def _hook(self, p: torch.Tensor) -> None:
        if self._phase is None:
            raise RuntimeError("fp8mp.step_in_backward: a backward ran outside StepInBackward.backward(loss) while "
                               "its hooks are on; call stepper.backward(loss), or stepper.remove() first")
        grad = p.grad
        p.grad = None
        if grad is None:
            return
        if id(p) in self._rows_taken:
            self._refuse_mixed(p)
        self._whole.add(id(p))
        held = _bytes(grad._indices()) + _bytes(grad._values()) if grad.is_sparse else _bytes(grad)
        self._hold(held)
        try:
            with torch.no_grad():
                if not grad.is_sparse:
                    self._use(p, grad)
                elif grad.sparse_dim() != 1 or grad.dense_dim() != p.dim() - 1:
                    raise RuntimeError(f"fp8mp.step_in_backward: a parameter of shape {list(p.shape)} has a sparse "
                                       "gradient that is not sparse along its rows only (nn.Embedding's sparse=True)")
                else:
                    self._use_sparse(p, grad)
        finally:
            self._hold(-held)

    def _use_sparse(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        """Step p from its row-sparse gradient a block of dense rows at a time (module docstring)."""
        rows = p.shape[0]
        block = rows if self.max_grad_block_bytes is None else self.block_rows(p)
        tokens = row_block_grads.TokenRows(grad._indices()[0], grad._values())
        for start, dense in tokens.dense_blocks(rows, block, tuple(p.shape[1:]), p.dtype):
            self._hold(_bytes(dense))
            try:
                self._use(p, dense, start)
            finally:
                self._hold(-_bytes(dense))
            del dense

    # ----------------------------------------------------------------------------- row blocks (RowBlockSink)
    def block_rows(self, weight: torch.Tensor) -> int:
        """Rows a block of `weight`'s gradient holds (fp8mp/optim/row_block_grads.py)."""
        return row_block_grads.rows_per_block(weight.shape, weight.element_size(), self.max_grad_block_bytes)

    def take_rows(self, weight: torch.Tensor, row_start: int, grad_rows: torch.Tensor) -> None:
        """Check or step rows [row_start, row_start + len(grad_rows)) of `weight` with their gradient."""
        if self._phase is None:
            raise RuntimeError("fp8mp.step_in_backward: gradient rows arrived outside StepInBackward.backward(loss)")
        if id(weight) in self._whole:
            self._refuse_mixed(weight)
        taken = self._rows_taken.get(id(weight), 0) + grad_rows.shape[0]
        if taken > weight.shape[0] or tuple(grad_rows.shape[1:]) != tuple(weight.shape[1:]):
            raise RuntimeError(f"fp8mp.step_in_backward: a parameter of shape {list(weight.shape)} received gradient "
                               "rows beyond its own (a weight used twice in one backward is not stepped in row "
                               "blocks: pass max_grad_block_bytes=None)")
        self._rows_taken[id(weight)] = taken
        self._hold(_bytes(grad_rows))
        try:
            with torch.no_grad():
                self._use(weight, grad_rows, row_start)
        finally:
            self._hold(-_bytes(grad_rows))

    @staticmethod
    def _refuse_mixed(p: torch.Tensor) -> None:
        raise RuntimeError(f"fp8mp.step_in_backward: a parameter of shape {list(p.shape)} received its gradient both "
                           "in row blocks and as a whole (a weight tied to another use, e.g. an LM head tied to the "
                           "embedding); pass max_grad_block_bytes=None, or keep the tied head out of the chunked loss")

    def _hold(self, nbytes: int) -> None:
        self._held += nbytes
        self.peak_grad_bytes = max(self.peak_grad_bytes, self._held)

    def _use(self, p: torch.Tensor, grad: torch.Tensor, row_start: int | None = None) -> None:
        """Check (first pass) or step (second pass) p with grad: the whole gradient, or with `row_start` the
        gradient of rows [row_start, row_start + len(grad)), which is checked, unscaled and stepped as a shard."""
        if self._phase == _DISCARD:
            return
        if self.scaler is not None:  # in place, as LossScaler.unscale_ unscales .grad
            found = self._found if self._phase == _CHECK else torch.zeros(1, dtype=torch.float32, device=grad.device)
            torch._amp_foreach_non_finite_check_and_unscale_([grad], found, self.scaler.inv_scale_on(grad.device))
        if self._phase == _CHECK:
            if self.optimizer.skip_nonfinite:
                self._found += self.optimizer._found_nonfinite([grad], [])
            return
        group = self._groups[id(p)]
        optimizer = self.optimizer
        layout = sharding.shard_layout(p, f"of shape {list(p.shape)}")
        state = optimizer._state_of(p, optimizer._state_dtype(group), layout)
        if row_start is None:
            local_state = {key: optimizer._local_state(key, value, p) for key, value in state.items()}
            optimizer._step_parameter(group, p, grad, local_state, None, layout.element_offset)
            return
        # A block steps as a shard starting at its first element; every block of p counts from the step count
        # p had before its first block, so that the count advances once.
        counter = self._counters.setdefault(id(p), state["step"].clone())
        start, end = row_start * layout.row_numel, (row_start + grad.shape[0]) * layout.row_numel
        block_state = {"step": counter.clone(), "seed": state["seed"]}
        for key, value in state.items():
            if key.endswith("_scale"):
                block_state[key] = value[start // STATE_BLOCK:-(-end // STATE_BLOCK)]
            elif key not in block_state:
                block_state[key] = value[row_start:row_start + grad.shape[0]]
        optimizer._step_parameter(group, p.detach()[row_start:row_start + grad.shape[0]], grad, block_state, None,
                                  start)
        state["step"].copy_(block_state["step"])

    # ----------------------------------------------------------------------------- the step
    def backward(self, loss: torch.Tensor) -> bool:
        """Backward of `loss` (scaled by the scaler when there is one) with every parameter stepped as its gradient
        is ready (module docstring). Returns False when the step was skipped (an Inf/NaN)."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            raise TypeError("StepInBackward.backward: argument 'loss' must be a 1-element tensor that requires grad")
        if not self._handles:
            raise RuntimeError("StepInBackward.backward: the hooks were removed")
        self._groups = {}
        for group in self.optimizer.param_groups:
            self.optimizer._check_group_hyper(group)
            for p in group["params"]:
                if p.grad is not None:
                    raise RuntimeError(
                        f"StepInBackward.backward: a parameter of shape {list(p.shape)} already holds a gradient: "
                        "gradient accumulation over micro-batches needs the gradient buffer; accumulate with "
                        "loss.backward() and optimizer.step() instead (stepper.remove() takes the hooks off)")
                if p.requires_grad and id(p) not in self._hooked:
                    raise RuntimeError(f"StepInBackward.backward: a parameter of shape {list(p.shape)} was added to the "
                                       "optimizer after step_in_backward; build a new stepper")
                self._groups[id(p)] = group
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        self.peak_grad_bytes, self.stepped = 0, True
        try:
            if self.verify:
                device = next(iter(self._groups_params())).device
                self._found = torch.zeros(1, dtype=torch.float32, device=device)
                self._pass(loss, _CHECK, retain_graph=True)
                if self.scaler is not None:
                    self.stepped = not self.scaler.record_checked_step(self.optimizer, self._found)
                else:
                    self.stepped = not bool(self._found.item())
            self._pass(loss, _STEP if self.stepped else _DISCARD, retain_graph=False)
        finally:
            self._phase, self._found = None, None
            self._rows_taken, self._whole, self._counters = {}, set(), {}
        return self.stepped

    def _pass(self, loss: torch.Tensor, phase: str, retain_graph: bool) -> None:
        """One backward of `loss` in `phase`, the row-blocked parameters' rows handed here."""
        self._phase = phase
        self._rows_taken, self._whole, self._counters = {}, set(), {}
        with (row_block_grads.handing_rows_to(self, self._row_blocked) if self._row_blocked
              else contextlib.nullcontext()):
            loss.backward(retain_graph=retain_graph)
        for p in self._row_blocked:
            if 0 < self._rows_taken.get(id(p), 0) < p.shape[0]:
                raise RuntimeError(f"fp8mp.step_in_backward: a parameter of shape {list(p.shape)} received gradient "
                                   f"rows for {self._rows_taken[id(p)]} of its {p.shape[0]} rows only")

    def _groups_params(self):
        return (p for group in self.optimizer.param_groups for p in group["params"])

    def clip_grad_norm_(self, *args, **kwargs):
        """Refused: a global norm needs every gradient before the first parameter steps."""
        raise RuntimeError("StepInBackward.clip_grad_norm_: clipping by a global gradient norm is not possible when "
                           "each parameter steps as its gradient arrives (the norm needs all of them first); train "
                           "without clipping, or with loss.backward(), clip_grad_norm_ and optimizer.step()")

    def remove(self) -> None:
        """Take the hooks off: the parameters' gradients accumulate in .grad again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def step_in_backward(optimizer: FusedOptimizer, scaler=None, verify: bool | None = None,
                     max_grad_block_bytes: int | None = DEFAULT_GRAD_BLOCK_BYTES) -> StepInBackward:
    """Step `optimizer`'s parameters in backward (fp8mp/optim/step_in_backward.py): returns the handle whose
    `backward(loss)` replaces ``loss.backward(); scaler.step(optimizer); optimizer.zero_grad()``.

    scaler: an fp8mp.LossScaler (its scale, unscale and Inf/NaN checks, FP8 casts included); call its
        `update()` after `backward` as usual.
    verify: check every gradient in a first backward pass before stepping in a second one (default: whenever a
        step can be skipped; False is refused then).
    max_grad_block_bytes: the most bytes of gradient a row block holds (default 1 MiB; at least the rows that
        make whole 128-element FP8 state blocks): parameters with a larger gradient are stepped a block of rows
        at a time where their gradient comes so (module docstring). None: every gradient whole.
    """
    return StepInBackward(optimizer, scaler=scaler, verify=verify, max_grad_block_bytes=max_grad_block_bytes)
