"""fp8mp's error contract across torch versions: shape and value errors are ValueError.

The C++ ops (csrc/common/stable.h) raise RuntimeError for the wrong kind of tensor
and, for a wrong shape or value, an error whose message starts with
``[ValueError] ``: an exception crossing the stable ABI reaches Python as
RuntimeError in some torch versions, whatever its C++ type. The wrappers of
fp8mp.ops run the ops through :func:`raising_value_errors`, which re-raises those
as ValueError with the tag removed.
"""
from __future__ import annotations

import functools

import torch

VALUE_ERROR_TAG = "[ValueError] "


def raising_value_errors(fn):
    """Decorator: a tagged error of an fp8mp op becomes ValueError (message without the tag)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling():  # traced: the fake kernels check, nothing to translate
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, ValueError) as error:
            message = str(error)
            if VALUE_ERROR_TAG not in message:
                raise
            raise ValueError(message.replace(VALUE_ERROR_TAG, "", 1)) from None

    return wrapper
