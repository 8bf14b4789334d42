"""Extern results laid out as ATen's device kernels make them, where the meta kernel says otherwise.

An extern's result gets the layout of the op's meta kernel, and the runtime converts a result
that comes back in another layout (client/runtime.py) before a kernel reads it. For 2-d
convolutions the meta kernels carry no device: torch 2.13's plans a contiguous output for a
channels-last input, torch 2.11's also a contiguous input gradient where the output gradient is
contiguous. cuDNN, and oneDNN on a CPU, return the output, the input gradient and the weight
gradient channels-last whenever the input or the weight is channels-last. Planned contiguous, each
of those results would cost a conversion at run time, and so would the ops reading them; planned
channels-last, the ops after them follow the layout (lowering/__init__.py realizes each result in
its meta layout).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch._prims_common import suggest_memory_format

from compiler.lowering.values import TensorValue

# op -> (position of its input, position of its weight, how many leading results follow them)
CONVOLUTIONS = {"aten.convolution.default": (0, 1, 1), "aten.convolution_backward.default": (1, 2, 2)}


def device_layouts(target: str, args: Sequence[Any], metas: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """`metas` with the layouts ATen's device kernels give `target`'s results."""
    found = CONVOLUTIONS.get(target)
    if found is None or len(args) <= max(found[:2]):
        return metas
    x, weight, count = args[found[0]], args[found[1]], found[2]
    if not (_channels_last(x) or _channels_last(weight)):
        return metas
    return [_as_channels_last(m) if i < count else m for i, m in enumerate(metas)]


def _as_channels_last(meta: torch.Tensor | None) -> torch.Tensor | None:
    if meta is None or meta.dim() != 4 or meta.dtype == torch.float64:
        return meta
    return meta.contiguous(memory_format=torch.channels_last)


def _channels_last(value: Any) -> bool:
    """Whether `value` (a lowered TensorValue, or a tensor: bench/case_cutting.py plans on meta
    tensors) is a 4-d tensor laid out channels-last."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 4 and suggest_memory_format(value) == torch.channels_last
    if not isinstance(value, TensorValue) or len(value.size) != 4:
        return False
    stride = getattr(getattr(value, "layout", None), "stride", None)
    if stride is None:  # a lazy value is realized contiguous
        return False
    meta = torch.empty_strided(value.size, stride, dtype=getattr(torch, value.dtype), device="meta")
    return suggest_memory_format(meta) == torch.channels_last
