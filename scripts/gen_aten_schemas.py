"""Writes compiler/aten_schemas.json: arity and return count of every ATen/prims overload.

The API validates graphs without importing torch, so it reads this table instead of
torch's registry. Regenerate it when moving to a new torch:
    .venv/bin/python scripts/gen_aten_schemas.py
"""

import json
from pathlib import Path

import torch


def describe(schema) -> list:
    returns = schema.returns
    if len(returns) == 1 and str(returns[0].type).startswith("List[Tensor]"):
        count = -1
    else:
        count = len(returns)
    positional = [a for a in schema.arguments if not a.kwarg_only]
    names = [a.name for a in schema.arguments]
    required = [a.name for a in schema.arguments if not a.has_default_value()]
    return [count, len(positional), names, required]


def main() -> None:
    table = {}
    for schema in torch._C._jit_get_all_schemas():
        ns, _, op = schema.name.partition("::")
        if ns not in ("aten", "prims"):
            continue
        overload = schema.overload_name or "default"
        table[f"{ns}.{op}.{overload}"] = describe(schema)
    out = Path(__file__).resolve().parent.parent / "compiler" / "aten_schemas.json"
    out.write_text(json.dumps(dict(sorted(table.items())), separators=(",", ":")))
    print(f"{len(table)} schemas -> {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
