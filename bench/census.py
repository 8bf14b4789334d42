"""Which bench cases a compiler switch changes, found on a CPU: each case is lowered, scheduled
and generated for a GPU target (heuristic configs, no autotuning, no benchmark-driven fusion) with
a boolean switch on and then off, and the cases whose kernel sources differ are listed, a line of
comma-separated names per case folder, ready for bench/switch_ab.py. A change that only
autotuning or benchmark-driven fusion would see is not found.

Several switches (comma-separated) are censused in one pass: a case is generated with every switch
as shipped and with every one flipped, and only where those differ with each flipped alone.

    python3 bench/census.py compiler.split_reductions.EXACT_CHUNKS [dir,dir...] [--json changed.json]
    python3 bench/census.py mod.A,mod.B [dir,dir...] [--json changed.json]  # {switch: {dir: names}}
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
    return changed_by_each([switch], folder, wanted)[switch]


def changed_by_each(switches: list[str], folder: Path, wanted: list[str] | None = None) -> dict[str, list[str]]:
    """For each switch, the cases of `folder` whose sources differ with it flipped alone. A case that
    every switch flipped at once leaves unchanged is taken as unchanged by each (a census of several
    switches then costs two generations for most cases). The switches are put back afterwards."""
    resolved = [resolve_switch(switch) for switch in switches]
    shipped = [getattr(module, attribute) for module, attribute in resolved]

    def digest_with(flipped: list[bool], case: Case) -> str:
        for (module, attribute), value, flip in zip(resolved, shipped, flipped):
            setattr(module, attribute, value != flip)
        return source_digest(case)

    changed: dict[str, list[str]] = {switch: [] for switch in switches}
    try:
        for case in load_cases(folder, wanted=wanted):
            as_shipped = digest_with([False] * len(switches), case)
            if len(switches) > 1 and digest_with([True] * len(switches), case) == as_shipped:
                continue
            for i, switch in enumerate(switches):
                if digest_with([j == i for j in range(len(switches))], case) != as_shipped:
                    changed[switch].append(case.name)
    finally:
        for (module, attribute), value in zip(resolved, shipped):
            setattr(module, attribute, value)
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("switch", help="a boolean module attribute, e.g. compiler.split_reductions.EXACT_CHUNKS, "
                                       "or several, comma-separated")
    parser.add_argument("folders", nargs="?", help="case folders, comma-separated (default: bench/cases)")
    parser.add_argument("--json", help="also write {folder: [names]} here ({switch: {folder: [names]}} for several)")
    args = parser.parse_args(argv)
    switches = args.switch.split(",")
    found: dict[str, dict[str, list[str]]] = {switch: {} for switch in switches}
    for folder in case_dirs(args.folders):
        for switch, changed in changed_by_each(switches, folder).items():
            found[switch][str(folder)] = changed
            label = f"{switch} " if len(switches) > 1 else ""
            print(f"{label}{folder} ({len(changed)}): {','.join(changed)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(found if len(switches) > 1 else found[switches[0]], indent=1) + "\n")


if __name__ == "__main__":
    main()
