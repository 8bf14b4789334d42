"""Bytes a training step hands from forward to backward, per partitioner (CPU, no GPU needed).

    python bench/partition_bytes.py [--models gpt2,llama] [--size bench] [--inductor] [--json out.json]

Each zoo model (tests/models/zoo.py, bf16) runs one training step under torch.compile with
aot_autograd split the way the fusewire backend splits it (`client.partition.aot_options`),
the graphs handed to a recorder instead of the service. Reported per partitioner:
  saved_mib      tensors the forward saves for the backward (activations the backward reads)
  tangents_mib   the backward's incoming gradients (aot_autograd materializes them)
  forward_out_mib  everything the forward graphs write as outputs (user outputs + saved)
  largest_saved  the biggest saved tensors: shape, dtype, MiB
`--inductor` adds a row split the way Inductor splits it (its decomposition table, the min-cut
partitioner), for comparison. These are exact byte counts of the graphs' inputs and outputs, not timings: the activation memory a
partition keeps between forward and backward, and bytes the forward writes and the backward reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "models")]

from client.partition import PARTITIONERS, aot_options  # noqa: E402
from zoo import ZOO, build, make_batch, step_loss  # noqa: E402


def _mib(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)) / 2**20


def measure(name: str, size: str, partitioner: str) -> dict:
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    model = build(name, size).to(dtype=torch.bfloat16)
    batch = make_batch(name, size)
    row = {"model": name, "size": size, "partitioner": partitioner, "saved_mib": 0.0, "tangents_mib": 0.0,
           "forward_out_mib": 0.0, "largest_saved": []}
    saved: list[tuple[str, torch.Tensor]] = []

    def forward(gm, example_inputs):
        def run(*args):
            outputs = gm(*args)
            row["forward_out_mib"] += _mib(outputs)
            return outputs
        return run

    def backward(gm, example_inputs):
        names = [p.name for p in gm.graph.find_nodes(op="placeholder")]
        for placeholder, value in zip(names, example_inputs):
            if not isinstance(value, torch.Tensor):
                continue
            if placeholder.startswith("tangents"):
                row["tangents_mib"] += _mib([value])
            else:
                saved.append((placeholder, value))
        return gm

    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=forward, bw_compiler=backward,
                                                         **_options(partitioner)))
    step_loss(compiled, name, batch).backward()
    row["saved_mib"] = _mib([v for _, v in saved])
    biggest = sorted(saved, key=lambda item: -item[1].numel() * item[1].element_size())[:3]
    row["largest_saved"] = [[list(v.shape), str(v.dtype).removeprefix("torch."), round(_mib([v]), 1)] for _, v in biggest]
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}


def _options(partitioner: str) -> dict:
    if partitioner != "inductor":
        return aot_options(partitioner)
    import functools

    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    return {"keep_inference_input_mutations": True, "decompositions": select_decomp_table(),
            "partition_fn": functools.partial(min_cut_rematerialization_partition, compiler="inductor")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--size", default="bench", choices=("tiny", "bench"))
    parser.add_argument("--inductor", action="store_true", help="also split as Inductor does")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        for partitioner in PARTITIONERS + (("inductor",) if args.inductor else ()):
            rows.append(measure(name, args.size, partitioner))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
