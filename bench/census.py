"""Which bench cases a compiler switch changes, found on a CPU: each case is lowered, scheduled
and generated for a GPU target (heuristic configs, no autotuning, no benchmark-driven fusion) with
a boolean switch on and then off, and the cases whose kernel sources differ are listed, a line of
comma-separated names per case folder, ready for bench/switch_ab.py. A change that only
autotuning or benchmark-driven fusion would see is not found.

    python3 bench/census.py compiler.split_reductions.EXACT_CHUNKS [dir,dir...] [--json changed.json]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.model_cases import Case, load_cases  # noqa: E402
from bench.side_by_side import case_dirs  # noqa: E402
from compiler.bounds import WorkLimits  # noqa: E402
from compiler.codegen import generate  # noqa: E402
from compiler.lowering import lower  # noqa: E402
from compiler.options import CompileOptions  # noqa: E402
from compiler.scheduler import schedule  # noqa: E402

TARGET = "cuda:sm_90"


def source_digest(case: Case) -> str:
    """A hash of the case's generated kernel sources."""
    generated = generate(schedule(lower(case.graph, WorkLimits()), CompileOptions(), None), TARGET)
    return hashlib.sha256("\n".join(k.source for k in generated.kernels).encode()).hexdigest()


def resolve_switch(switch: str) -> tuple[ModuleType, str]:
    """The module and the attribute name of a switch written module.ATTR."""
    module_name, _, attribute = switch.rpartition(".")
    module = importlib.import_module(module_name)
    if not isinstance(getattr(module, attribute, None), bool):
        raise SystemExit(f"{switch}: not a boolean attribute of {module_name}")
    return module, attribute


def changed_cases(switch: str, folder: Path, wanted: list[str] | None = None) -> list[str]:
    """Names of the cases of `folder` whose sources differ with `switch` (module.ATTR) on and off;
    the switch is put back afterwards."""
    module, attribute = resolve_switch(switch)
    shipped = getattr(module, attribute)
    changed = []
    try:
        for case in load_cases(folder, wanted=wanted):
            digests = set()
            for value in (True, False):
                setattr(module, attribute, value)
                digests.add(source_digest(case))
            if len(digests) > 1:
                changed.append(case.name)
    finally:
        setattr(module, attribute, shipped)
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("switch", help="a boolean module attribute, e.g. compiler.split_reductions.EXACT_CHUNKS")
    parser.add_argument("folders", nargs="?", help="case folders, comma-separated (default: bench/cases)")
    parser.add_argument("--json", help="also write {folder: [names]} here")
    args = parser.parse_args(argv)
    found = {}
    for folder in case_dirs(args.folders):
        changed = found[str(folder)] = changed_cases(args.switch, folder)
        print(f"{folder} ({len(changed)}): {','.join(changed)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
