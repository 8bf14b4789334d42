"""What lowering may reuse between calls of one op on arguments alike: the outputs an op gives
on meta tensors, and the traced decomposition of an op, depend only on the op, its tensors'
dtypes, sizes and strides, and its other arguments' values. A large graph repeats the same
few signatures thousands of times (every layer of a model, every step of a chain), and
running torch's meta kernels or tracing a decomposition is most of what lowering a node costs.

`signature(op, args, kwargs)` is that key, or None when an argument is of a kind not known
to be safe to compare (then the caller computes afresh).
"""

from __future__ import annotations

from typing import Any, Hashable

import torch

from compiler.lowering.values import StorageView, TensorValue

_PLAIN = (bool, int, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


class _NoSignature(Exception):
    pass


def signature(op: Any, args: list, kwargs: dict) -> Hashable | None:
    try:
        return op, _key(args), tuple((name, _key(value)) for name, value in kwargs.items())
    except _NoSignature:
        return None


def _key(value: Any) -> Hashable:
    if isinstance(value, TensorValue):
        # as lowering.to_meta makes it: strided for a view of a buffer, contiguous otherwise
        stride = tuple(value.layout.stride) if isinstance(value, StorageView) else None
        return "tensor", value.dtype, tuple(value.size), stride
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(_key(v) for v in value)
    if value is None:
        return "none"
    if isinstance(value, float):
        return "float", repr(value)  # repr: 0.0 and -0.0 (equal as floats) stay apart, and nan matches nan
    if isinstance(value, _PLAIN):
        return type(value).__name__, value  # the type: 1, 1.0 and True are equal as keys otherwise
    raise _NoSignature
