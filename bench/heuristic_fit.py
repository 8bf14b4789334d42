"""How far the heuristics' launch configs are from autotuning's picks over whole case sets, and which
single config per kind of kernel would have done best: heuristics fitted to the whole measured set,
not to one case. Where a large graph's tuning budget runs out (a big backward graph), its kernels
keep the heuristic's config, so the heuristic is what most of such a graph runs.

    collect (GPU): every kernel of every case is autotuned (benchmark-driven fusion off, a budget
    that reaches every kernel); one JSON line per kernel: its family, sizes, every candidate config
    with its time, the heuristic's config being candidate 0.
        python3 bench/heuristic_fit.py collect out.jsonl bench/cases,bench/channels_last [--shard 0/2] [--deadline-s 200]
            [--families mixed,row-looped]   (only the cases with a kernel of those families)

    fit (CPU): per family and column/row length, each config scored by the geomean of its time over
    the fastest candidate's, over the kernels of the `--fit` sets; the heuristic's score and the best
    config's, on those sets and on the rest (held out).
        python3 bench/heuristic_fit.py fit out.jsonl --fit cases,channels_last
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernels import parse_shard  # noqa: E402
from bench.model_cases import load_cases  # noqa: E402

# a config shared by at least this share of a bucket's kernels can be its fitted default
MIN_SHARE = 0.8


def family(config: dict, rnumel: int) -> str:
    """The kind of kernel a (heuristic) config makes."""
    if config.get("phases") or config.get("parts"):
        return "phases"
    if config.get("tiled"):
        return "tiled"
    if config.get("mix_rows"):
        return "mixed"
    if rnumel == 1:
        return "pointwise"
    return ("outer" if config.get("outer") else "row") + ("-persistent" if config["persistent"] else "-looped")


def length_bucket(rnumel: int) -> str:
    for limit in (64, 256, 1024, 8192):
        if rnumel <= limit:
            return f"<={limit}"
    return ">8192"


def config_key(config: dict, rnumel: int) -> str:
    """A config as a rule over shapes: a persistent one's RBLOCK is the row or column, whole."""
    rblock = "whole" if config.get("persistent") and rnumel > 1 else config["RBLOCK"]
    ahead = f" p{config['loop_stages']}" if config.get("loop_stages") else ""  # a pipelined loop's stages
    return (f"{'persistent' if config.get('persistent') else 'looped'} X{config['XBLOCK']} R{rblock} "
            f"w{config['num_warps']} s{config.get('num_stages', 1)}{ahead}")


def kernel_families(graph) -> set[str]:
    """The families of a graph's kernels with their heuristic configs (codegen only, nothing built)."""
    from compiler.codegen import generate
    from compiler.lowering import lower
    from compiler.options import CompileOptions
    from compiler.scheduler import schedule

    generated = generate(schedule(lower(graph), CompileOptions(benchmark_fusion=False)), "cuda:sm_90")
    return {family(k.config, k.rnumel) for k in generated.kernels}


def collect(out: str, folders: list[Path], shard: tuple[int, int], deadline_s: float,
            families: set[str] | None = None) -> None:
    import compiler
    from client.cubin import cuda_target

    started = time.time()
    # the folders' cases in turn, so that a deadline leaves a sample of every folder
    per_folder = [[(folder, case) for case in load_cases(folder)] for folder in folders]
    cases = [pair for turn in itertools.zip_longest(*per_folder) for pair in turn if pair is not None]
    index, count = shard
    for position, (folder, case) in enumerate(cases):
        if position % count != index:
            continue
        if time.time() - started > deadline_s:
            print(f"deadline: stopped before {case.name}", flush=True)
            break
        if families and not kernel_families(case.graph) & families:
            continue
        try:
            artifact = compiler.compile(case.graph, cuda_target(), {"benchmark_fusion": False, "autotune_budget_s": 600})
        except Exception as exc:  # one case that does not compile must not stop the rest
            print(f"{case.name}: {type(exc).__name__}: {exc}"[:300], flush=True)
            continue
        with open(out, "a") as f:
            for kernel in artifact.manifest["kernels"]:
                tuning = kernel.get("autotune")
                if not tuning:
                    continue
                f.write(json.dumps({"set": folder.name, "case": case.name, "kernel": kernel["name"],
                                    "numel": kernel["numel"], "rnumel": kernel["rnumel"],
                                    "family": family(tuning["candidates"][0], kernel["rnumel"]),
                                    "candidates": tuning["candidates"], "ms": tuning["ms"],
                                    "chosen": tuning["chosen"]}) + "\n")
        print(f"{case.name}: {len(artifact.manifest['kernels'])} kernels", flush=True)


def _slowdowns(row: dict) -> dict[str, float]:
    """Each candidate's time over the fastest's, by config key (a key met twice keeps its best)."""
    timed = [(config_key(c, row["rnumel"]), ms) for c, ms in zip(row["candidates"], row["ms"]) if ms]
    if not timed:
        return {}
    fastest = min(ms for _, ms in timed)
    result: dict[str, float] = {}
    for key, ms in timed:
        result[key] = min(result.get(key, math.inf), ms / fastest)
    return result


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def fit(rows: list[dict], fit_sets: set[str]) -> list[dict]:
    """Per (family, length bucket): the heuristic's geomean slowdown and the best shared config's,
    on the fitting sets and on the held-out rest."""
    buckets: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        buckets[(row["family"], length_bucket(row["rnumel"]))].append(row)
    report = []
    for (kind, length), members in sorted(buckets.items()):
        fitting = [r for r in members if r["set"] in fit_sets]
        held_out = [r for r in members if r["set"] not in fit_sets]
        scores = [_slowdowns(r) for r in fitting]
        keys = {k for s in scores for k in s}
        shared = [k for k in keys if sum(k in s for s in scores) >= MIN_SHARE * len(scores)]
        best = min(shared, key=lambda k: _score(scores, k), default=None)
        entry = {"family": kind, "length": length, "kernels": len(fitting), "held_out_kernels": len(held_out),
                 "heuristic": _heuristic_score(fitting, scores),
                 "best": best, "best_score": _score(scores, best) if best else math.nan}
        if held_out and best:
            held = [_slowdowns(r) for r in held_out]
            entry["held_out_heuristic"] = _heuristic_score(held_out, held)
            entry["held_out_best"] = _score(held, best)
            entry["held_out_best_coverage"] = sum(best in s for s in held)
        report.append(entry)
    return report


def _score(slowdowns: list[dict[str, float]], key: str) -> float:
    """A config's geomean slowdown over the kernels that tried it."""
    return _geomean([s[key] for s in slowdowns if key in s])


def _heuristic_score(rows: list[dict], slowdowns: list[dict[str, float]]) -> float:
    """The heuristic's (candidate 0's) geomean slowdown over the rows where it was timed."""
    return _geomean([s.get(config_key(r["candidates"][0], r["rnumel"]), math.nan)
                     for r, s in zip(rows, slowdowns) if r["ms"][0]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("out")
    c.add_argument("folders")
    c.add_argument("--shard", type=parse_shard, default=(0, 1))
    c.add_argument("--deadline-s", type=float, default=math.inf)
    c.add_argument("--families", default="", help="comma-separated families (see family()); only cases with such kernels")
    f = sub.add_parser("fit")
    f.add_argument("rows")
    f.add_argument("--fit", required=True, help="comma-separated set names (case folder names) to fit on")
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.out, [Path(d) for d in args.folders.split(",")], args.shard, args.deadline_s,
                set(filter(None, args.families.split(","))))
        return
    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines() if line.strip()]
    for entry in fit(rows, set(args.fit.split(","))):
        print(json.dumps(entry))


if __name__ == "__main__":
    main()
