"""The machinery every fused optimizer of fp8mp shares: state creation, argument checks, the on-device
non-finite check, and a bit-exact state_dict round trip.

A subclass names its states (``state_names``) and runs its op on one parameter (``_step_parameter``); the
states are created here in the optimizer's `state_dtype`: float32, bfloat16, or float8_e4m3fn with one
float32 scale per 128 elements (state ``<name>_scale``); the ops round bfloat16 and FP8 values stochastically
(fp8mp/ops/optim.py). Every state entry is a tensor, so
``torch.save(optimizer.state_dict())`` loads back with ``torch.load(weights_only=True)``:

* ``step``: 1-element int64 on the parameter's device, the steps taken; the op increments it, and it is the
  counter of the stochastic rounding (the bits of step t are hashed from (seed, t, element));
* ``seed``: 1-element int64 on the CPU, this parameter's stochastic-rounding stream (the optimizer's `seed`
  plus the parameter's position when the state is created).

A step whose gradients hold an Inf or a NaN changes nothing (per step: no parameter, state or step count of
any parameter moves), decided on the device without a host sync: the min and max of every gradient (a read of
each, ``torch.aminmax``) gives the flag each op reads. ``skip_nonfinite=False`` leaves that read out
for callers that have skipped such steps themselves (fp8mp's LossScaler does).

A param group may set its own ``state_dtype`` (``{'params': [...], 'state_dtype': torch.bfloat16}``); the
others take the optimizer's.

DTensor parameters (FSDP2's ``fully_shard``, sharded along dim 0; fp8mp/optim/sharding.py) are stepped on
their local shards, with no gather: the ops take ``p.to_local()`` and ``p.grad.to_local()`` and the shard's
offset in the whole tensor, so the stochastic rounding draws the unsharded step's bits and the FP8 blocks are
the whole tensor's: the same step writes the same bits whatever the sharding. The moments (and the FP8
scales) are DTensors with the parameter's mesh and placements, which ``torch.distributed.checkpoint`` saves and
loads shard by shard (``get_state_dict`` / ``set_state_dict``); ``step`` and ``seed`` are the same on every
rank and stay plain tensors. The non-finite flag of the local gradients is max-reduced over the mesh (one
``all_reduce`` per process group the parameters are sharded over), so every rank skips the same steps.
"""
from __future__ import annotations

import torch

from fp8mp.ops import optim as optim_ops
from fp8mp.optim import sharding
from fp8mp.utils.dtensor import is_dtensor, local

__all__ = ["FusedOptimizer"]

STATE_DTYPES = optim_ops.STATE_DTYPES
PARAM_DTYPES = optim_ops.PARAM_DTYPES


class FusedOptimizer(torch.optim.Optimizer):
    """Base of fp8mp's fused optimizers (see the module docstring). Not used directly."""

    state_names: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict, *, state_dtype: torch.dtype, seed: int, skip_nonfinite: bool):
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"{type(self).__name__}: argument 'state_dtype' must be one of "
                             f"{', '.join(map(str, STATE_DTYPES))}, got {state_dtype!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"{type(self).__name__}: argument 'seed' must be an int, got {type(seed).__name__}")
        self.state_dtype = state_dtype
        self.seed = seed
        self.skip_nonfinite = bool(skip_nonfinite)
        # In every param group, so that a checkpoint says which dtype its states are in (see load_state_dict).
        super().__init__(params, {**defaults, "state_dtype": state_dtype})

    # --------------------------------------------------------------------------------- checks
    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group, refusing parameters these kernels cannot update: non-float ones (TypeError)
        and parameters on more than one device within the optimizer (ValueError)."""
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        name = type(self).__name__
        state_dtype = param_group.get("state_dtype", self.state_dtype)
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"{name}: a param group's 'state_dtype' must be one of "
                             f"{', '.join(map(str, STATE_DTYPES))}, got {state_dtype!r}")
        for i, p in enumerate(params):
            if isinstance(p, torch.Tensor) and p.dtype not in PARAM_DTYPES:
                raise TypeError(f"{name}: argument 'params' holds a {p.dtype} parameter (index {i} of its group, "
                                f"shape {list(p.shape)}); it updates float32 and bfloat16 parameters")
        devices = {p.device for group in self.param_groups for p in group["params"]}
        devices |= {p.device for p in params if isinstance(p, torch.Tensor)}
        if len(devices) > 1:
            raise ValueError(f"{name}: argument 'params' holds parameters on mixed devices "
                             f"({', '.join(sorted(map(str, devices)))}); use one optimizer per device")
        super().add_param_group(param_group)

    def _check_group_hyper(self, group: dict) -> None:
        """Subclasses: raise ValueError naming a hyperparameter out of its range."""

    # --------------------------------------------------------------------------------- state
    def _parameter_index(self, p: torch.Tensor) -> int:
        for index, q in enumerate(q for group in self.param_groups for q in group["params"]):
            if q is p:
                return index
        raise KeyError("parameter not in this optimizer")

    def _state_dtype(self, group: dict) -> torch.dtype:
        return group.get("state_dtype", self.state_dtype)

    def _state_of(self, p: torch.Tensor, state_dtype: torch.dtype, layout: sharding.ShardLayout) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros(1, dtype=torch.int64, device=p.device)
            state["seed"] = torch.tensor([self.seed + self._parameter_index(p)], dtype=torch.int64)
            dtensor = is_dtensor(p)
            for name in self.state_names:
                # zeros_like of a DTensor: a DTensor with p's mesh and placements, its local shard p's.
                state[name] = (torch.zeros_like(p, dtype=state_dtype, memory_format=torch.contiguous_format)
                               if dtensor else torch.zeros(p.shape, dtype=state_dtype, device=p.device))
                if state_dtype == torch.float8_e4m3fn:
                    state[name + "_scale"] = self._new_scale(p, layout)
        return state

    @staticmethod
    def _new_scale(p: torch.Tensor, layout: sharding.ShardLayout) -> torch.Tensor:
        """Zero FP8 block scales of `p`: 1-D of a plain tensor, a DTensor sharded like p of a DTensor
        (fp8mp/optim/sharding.py)."""
        if not is_dtensor(p):
            return torch.zeros(optim_ops.state_scale_numel(p.numel()), dtype=torch.float32, device=p.device)
        import torch.distributed.tensor as dtensor
        return dtensor.zeros(sharding.scale_shape(layout), dtype=torch.float32, device_mesh=p.device_mesh,
                             placements=p.placements)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict, keeping every state tensor's dtype and bits (torch's would cast them to the
        parameter's dtype). A state saved with another state_dtype is refused (ValueError naming the parameter),
        by the dtype of its tensors and by its param group's 'state_dtype': torch.distributed.checkpoint's load
        copies the stored values into the tensors of this optimizer's state, so an FP8 state loaded into
        bfloat16 or float32 states would arrive as codes without their scales. The saved state is keyed as its
        param_groups list the parameters (indices from state_dict(), names from
        torch.distributed.checkpoint's get_state_dict)."""
        saved = state_dict["state"]
        current = [(p, self._state_dtype(group)) for group in self.param_groups for p in group["params"]]
        saved_dtypes = [(key, group.get("state_dtype")) for group in state_dict["param_groups"]
                        for key in group["params"]]
        by_key = {key: entry for (key, _), entry in zip(saved_dtypes, current)}
        for (key, saved_dtype), (_, dtype) in zip(saved_dtypes, current):
            values = saved.get(key, {})
            found_dtypes = {saved_dtype or dtype} | {values[name].dtype for name in self.state_names if name in values}
            for found in sorted(found_dtypes, key=str):
                if found != dtype:
                    raise ValueError(f"{type(self).__name__}.load_state_dict: argument 'state_dict' holds the states "
                                     f"of parameter {key} in {found}, this optimizer's state_dtype for it is {dtype}; "
                                     "build the optimizer (or that param group) with the checkpoint's state_dtype")
        group_dtypes = [self._state_dtype(group) for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, dtype in zip(self.param_groups, group_dtypes):  # a checkpoint saved without the key
            group.setdefault("state_dtype", dtype)
        for key, values in saved.items():
            p = by_key[key][0]
            self.state[p] = {name: value.to(device=torch.device("cpu") if name == "seed" else p.device, copy=True)
                             for name, value in values.items()}

    def state_bytes(self) -> int:
        """Bytes of optimizer state this process holds now (moments, scales, counters; of a DTensor state, its
        local shard)."""
        return sum(local(v).numel() * v.element_size() for s in self.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor))

    # --------------------------------------------------------------------------------- step
    @staticmethod
    def _found_nonfinite(grads: list[torch.Tensor], groups: list) -> torch.Tensor:
        """1-element float32 on the gradients' device: 1 when any gradient holds an Inf or a NaN (min and max
        propagate NaN and show -Inf and +Inf), without a host sync. torch.aminmax rather than
        torch._foreach_norm(grads, inf): half the time on CPU (22 against 52 ms on a 2048x2048 fp32 gradient).
        `grads` are local tensors; the flag is max-reduced over each process group of `groups` (the shards'),
        so that every rank holds the same."""
        extremes = [value.float() for g in grads if g.numel() for value in torch.aminmax(g)]
        if extremes:
            found = torch.stack(extremes).isfinite().all().logical_not().float().reshape(1)
        else:  # every local shard empty
            found = torch.zeros(1, dtype=torch.float32, device=grads[0].device)
        for group in groups:
            torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MAX, group=group)
        return found

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every parameter with a gradient; returns closure's loss if a closure is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for group_index, group in enumerate(self.param_groups):
            self._check_group_hyper(group)
            state_dtype = self._state_dtype(group)
            for param_index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__}: a parameter of shape {list(p.shape)} has a sparse "
                                       "gradient; fp8mp's fused optimizers take dense gradients only")
                layout = self._checked_layout(p, state_dtype, f"{param_index} of param group {group_index}")
                work.append((group, p, state_dtype, layout))
        if not work:
            return loss
        for _, p, _, _ in work:  # every check passed: now the collectives, in parameter order on every rank
            if is_dtensor(p) and p.grad.placements != p.placements:
                # Partial sums of a replicated parameter's gradient (sequence parallel's norm weights): one all_reduce
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        found_inf = None
        if self.skip_nonfinite:
            found_inf = self._found_nonfinite([local(p.grad) for _, p, _, _ in work],
                                              sharding.reduction_groups(p for _, p, _, _ in work))
        for group, p, state_dtype, layout in work:
            state = self._state_of(p, state_dtype, layout)
            local_state = {key: self._local_state(key, value, p) for key, value in state.items()}
            # An empty shard (FSDP2's last ranks when rows < ranks * chunk) steps nothing but its counter; its
            # offset, the tensor's end, need not be a block boundary, so it passes 0.
            offset = layout.element_offset if local(p).numel() else 0
            self._step_parameter(group, local(p), local(p.grad), local_state, found_inf, offset)
        return loss

    def _checked_layout(self, p: torch.Tensor, state_dtype: torch.dtype, name: str) -> sharding.ShardLayout:
        """The shard layout of p (fp8mp/optim/sharding.py), after checking that its gradient is sharded like it and
        that its FP8 blocks can follow the whole tensor; every check raises before any collective of the step."""
        layout = sharding.shard_layout(p, name)
        if is_dtensor(p) != is_dtensor(p.grad) or (
                is_dtensor(p) and not sharding.grad_matches(p, p.grad)):
            raise ValueError(f"{type(self).__name__}: parameter {name} (shape {list(p.shape)}) has a gradient not "
                             "sharded like it; the fused optimizers step a DTensor parameter with a DTensor "
                             "gradient of the same mesh and placements (FSDP2's reduce-scattered gradients; "
                             "Partial where the parameter is replicated)")
        if state_dtype == torch.float8_e4m3fn:
            sharding.check_fp8_blocks(p, layout, name)
        return layout

    def _local_state(self, key: str, value: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """A state entry as the op takes it: the local shard of a DTensor state, an FP8 scale as the
        ceil(local numel / 128) scales of the shard's blocks (a view: the op writes the state's storage)."""
        if is_dtensor(value) != (is_dtensor(p) and key not in ("step", "seed")):
            raise ValueError(f"{type(self).__name__}: the state '{key}' of a parameter of shape {list(p.shape)} is "
                             f"{'a DTensor' if is_dtensor(value) else 'a plain tensor'} where the "
                             "parameter's shards need the other; load DTensor parameters' states with "
                             "torch.distributed.checkpoint's set_state_dict")
        value = local(value)
        if key.endswith("_scale") and is_dtensor(p):
            value = value.reshape(-1)[:optim_ops.state_scale_numel(local(p).numel())]
        return value

    def _step_parameter(self, group: dict, p: torch.Tensor, grad: torch.Tensor, state: dict,
                        found_inf: torch.Tensor | None, element_offset: int) -> None:
        """Run the subclass's op on local tensors: p, grad and the states (`state`, from _local_state) of one
        shard, which starts at element `element_offset` of the whole parameter."""
        raise NotImplementedError

    def _scale(self, state: dict, name: str) -> torch.Tensor | None:
        return state.get(name + "_scale")

    @staticmethod
    def _float(value) -> float:
        """A hyperparameter as a Python float (an LR scheduler may have put a tensor in the group)."""
        return float(value.item()) if isinstance(value, torch.Tensor) else float(value)
