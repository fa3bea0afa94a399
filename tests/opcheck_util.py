"""Checks every fp8mp op gets: torch.library.opcheck with float8 inputs, and the same error from every kernel."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def opcheck_fp8_aware(op, args) -> None:
    """opcheck `op` on `args`; with float8 inputs, check their bits are unchanged instead of test_schema.

    torch's test_schema compares inputs with allclose, which has no float8
    kernel; the other checks run as usual and the no-mutation claim of the
    schema is verified by comparing the inputs' bits before and after.
    """
    fp8_inputs = [a for a in args if isinstance(a, torch.Tensor) and a.dtype in FLOAT8_DTYPES]
    if not fp8_inputs:
        torch.library.opcheck(op, args)
        return
    before = [a.view(torch.uint8).clone() for a in fp8_inputs]
    torch.library.opcheck(op, args, test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert all(torch.equal(a.view(torch.uint8), b) for a, b in zip(fp8_inputs, before))


def error_of(call, device: str) -> tuple[type, str]:
    """The exception type and message of `call(device)`; device "fake" runs call("cpu") under FakeTensorMode."""
    with pytest.raises((RuntimeError, ValueError, TypeError)) as info:
        if device == "fake":
            with FakeTensorMode():
                call("cpu")
        else:
            call(device)
    return info.type, str(info.value)
