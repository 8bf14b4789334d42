"""Typed names for values in generated Triton code, and dtype rules."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

TL_DTYPES = {
    "float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16", "float64": "tl.float64",
    "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8",
    "bool": "tl.int1", "uint16": "tl.uint16", "uint32": "tl.uint32", "uint64": "tl.uint64",
}
_PROMOTION = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


@dataclass(frozen=True)
class Var:
    """A named value in a kernel, with the dtype it is computed in."""

    name: str
    dtype: str

    def __str__(self) -> str:
        return self.name


def promote(a: str, b: str) -> str:
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return a if _PROMOTION.index(a) >= _PROMOTION.index(b) else b


def is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype == "bfloat16"


def literal(value: Any, dtype: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return 'float("nan")'
    if isinstance(value, float) and math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    if dtype == "bool":
        return "1" if value else "0"
    if is_float(dtype):
        return repr(float(value))
    return str(int(value))
