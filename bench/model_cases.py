"""The kernel benchmark's case set drawn from real models: every kernel group fusewire's scheduler
makes for the training graphs of the model zoo, a CNN normalization block and an AdamW update,
deduplicated by structure, one JSON file per case.

    python bench/model_cases.py --size bench --out bench/cases      # the checked-in set
    python bench/model_cases.py --size tiny --out /tmp/cases        # its CI-sized twin
    python bench/kernels.py --set models                            # times the set on a GPU
    python bench/model_cases.py --sources mistral,swin --exclude-dir bench/cases --one-per-family 1048576 \
        --out /tmp/held_out                                         # held-out models: one case per new kind
    python bench/model_cases.py --sources resnet,cnn_norm --channels-last auto --exclude-dir bench/cases \
        --out bench/channels_last                                   # CNNs as the backend compiles them on a GPU

Graphs are captured on fake tensors (bench/model_capture.py: nothing is computed, at any size)
and cut into one case per kernel group (bench/case_cutting.py). Two cases are the same when
their wire graphs are equal after renaming values canonically (same ops, shapes, strides,
dtypes and literal arguments): the first one met is kept, sources in the order of SOURCES.
A case file holds a header (name, source model and graph, kernel group, bytes to move, input
value ranges) and the wire graph; no tensor data beyond tiny constants.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import pickle
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.case_cutting import Case, group_cases, whole_graph_case  # noqa: E402
from compiler.graph import Graph, parse_graph  # noqa: E402

if TYPE_CHECKING:
    from bench.model_capture import CapturedGraph

CASES_DIR = ROOT / "bench" / "cases"
HELD_OUT_DIR = ROOT / "bench" / "held_out"  # the held-out models' cases (docs/PERF.md)
CHANNELS_LAST_DIR = ROOT / "bench" / "channels_last"  # CNN cases as the backend compiles them on a GPU
FORMAT = "fusewire-bench-case-1"


@dataclass
class SourceReport:
    """What one source contributed: graphs captured, kernel-group cases cut from them, the new ones
    among these (the rest duplicate a case met before), groups left out (by reason), graphs that
    could not be cut (with the error), whole graphs kept."""

    graphs: int = 0
    groups: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)
    whole: int = 0

    @property
    def duplicates(self) -> int:
        return self.groups - self.kept

    def line(self, source: str) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return (f"{source}: {self.graphs} graphs, {self.groups} kernel-group cases, {self.kept} new "
                f"({self.duplicates} duplicates)" + (f"; groups left out: {skipped}" if skipped else "")
                + (f"; {self.whole} whole graphs" if self.whole else "")
                + "".join(f"\n  NOT CUT: {failure}" for failure in self.failed))


@dataclass
class CaseSet:
    cases: list[Case] = field(default_factory=list)
    reports: dict[str, SourceReport] = field(default_factory=dict)


# ---------------------------------------------------------------------------------
# building the set
# ---------------------------------------------------------------------------------


# One source's capture may take this long; a longer one is reported as not cut and the next goes on
# (Mamba's bench-size capture runs its slow-path scan one token at a time, and held up the models
# after it until the GPU machine's call ended, H100 2026-11-27).
CAPTURE_LIMIT_S = 300.0


def extract_cases(size: str, sources: list[str] | None = None, whole_graphs: bool = False,
                  progress: Callable[[str], None] = lambda line: None, known: Iterable[Case] = (),
                  channels_last: str = "off", capture_limit_s: float = CAPTURE_LIMIT_S, jobs: int = 1) -> CaseSet:
    """Captures each source at `size` (bench/model_capture.py; `channels_last` as the backend's
    setting), each within `capture_limit_s`, `jobs` sources at a time in separate processes, and
    makes the case set of its graphs."""
    from bench import model_capture

    names = sources or list(model_capture.SOURCES)
    if jobs > 1 and len(names) > 1:
        captured = _captured_in_processes(names, size, channels_last, capture_limit_s, jobs)
    else:
        captured = ((source, capture_within(source, size, channels_last, capture_limit_s)) for source in names)
    return cases_from_graphs(captured, whole_graphs, progress, known)


def capture_within(source: str, size: str, channels_last: str,
                   capture_limit_s: float) -> list[CapturedGraph] | Exception:
    """One source's graphs, or the exception that stopped its capture (one source that cannot be
    captured must not hide the others)."""
    from bench import model_capture

    try:
        with time_limit(capture_limit_s):
            return model_capture.capture_source(source, size, channels_last)
    except Exception as exc:
        return exc


def _capture_in_worker(source: str, size: str, channels_last: str,
                       capture_limit_s: float) -> list[CapturedGraph] | Exception:
    """capture_within in a worker process: an exception that cannot be pickled back (BART's holds
    a pybind11 object) is returned as a RuntimeError naming it."""
    result = capture_within(source, size, channels_last, capture_limit_s)
    if isinstance(result, Exception):
        try:
            pickle.dumps(result)
        except Exception:
            return RuntimeError(f"{type(result).__name__}: {result}")
    return result


def _captured_in_processes(sources: list[str], size: str, channels_last: str, capture_limit_s: float,
                           jobs: int) -> Iterator[tuple[str, list[CapturedGraph] | Exception]]:
    """capture_within for each source in `jobs` processes, yielded in the order of `sources`, so
    that deduplication keeps the same cases as a capture in one process. Spawned, not forked: a
    forked child cannot use the parent's CUDA context."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_capture_in_worker, source, size, channels_last, capture_limit_s) for source in sources]
        for source, future in zip(sources, futures):
            try:
                yield source, future.result()
            except Exception as exc:  # the worker itself died (out of memory, a signal)
                yield source, exc


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raises TimeoutError in the main thread once `seconds` have passed inside the block."""
    def expire(signum, frame):
        raise TimeoutError(f"took over {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def cases_from_graphs(captured: Iterable[tuple[str, list[CapturedGraph] | Exception]], whole_graphs: bool = False,
                      progress: Callable[[str], None] = lambda line: None, known: Iterable[Case] = ()) -> CaseSet:
    """Cuts every graph into kernel-group cases, drops structural duplicates (the first met is
    kept, and none that is one of `known`: a held-out set holds only what another set lacks) and
    names the rest uniquely. `whole_graphs` adds each captured graph as one case. A source given
    as an exception (its capture failed) is reported as not cut."""
    result, seen = CaseSet(), {case.key for case in known}

    def keep(case: Case) -> bool:
        if case.key in seen:
            return False
        seen.add(case.key)
        result.cases.append(case)
        return True

    started = time.perf_counter()
    for source, graphs in captured:
        report = result.reports.setdefault(source, SourceReport())
        if isinstance(graphs, Exception):
            report.failed.append(f"capture: {type(graphs).__name__}: {graphs}"[:300])
            graphs = []
        for graph in graphs:
            report.graphs += 1
            try:
                found = group_cases(graph.graph, source, graph.name, report.skipped)
            except Exception as exc:  # one graph the cutter cannot handle must not hide the others
                report.failed.append(f"{graph.name}: {type(exc).__name__}: {exc}"[:300])
                found = []
            report.groups += len(found)
            report.kept += sum(keep(case) for case in found)
            if whole_graphs:
                report.whole += keep(whole_graph_case(graph.graph, source, graph.name))
        progress(f"{report.line(source)} ({time.perf_counter() - started:.1f} s)")
        started = time.perf_counter()
    unique_names(result.cases)
    return result


def family_key(case: Case) -> tuple:
    """A case's kind regardless of sizes: its ATen ops in program order (views left out) and its
    inputs' dtypes."""
    from compiler.scheduler import VIEW_OPS

    ops = tuple(node.target for node in case.graph.nodes if node.target.split(".")[1] not in VIEW_OPS)
    return ops, tuple(sorted({spec.dtype for spec in case.graph.inputs}))


def one_per_family(cases: list[Case], min_bytes: int = 0) -> list[Case]:
    """Of cases moving at least `min_bytes`, the one moving the most bytes of each family
    (family_key), in the order met: a held-out sample of every kind of kernel, without timing the
    same kernel at each of a CNN's widths."""
    largest: dict[tuple, Case] = {}
    for case in cases:
        if case.moved_bytes >= min_bytes:
            key = family_key(case)
            if key not in largest or case.moved_bytes > largest[key].moved_bytes:
                largest[key] = case
    kept = {id(case) for case in largest.values()}
    return [case for case in cases if id(case) in kept]


def unique_names(cases: list[Case]) -> None:
    """Makes names unique in order: the second `x` becomes `x_2`, the third `x_3`."""
    counts: dict[str, int] = {}
    for case in cases:
        stem = case.name
        counts[stem] = counts.get(stem, 0) + 1
        if counts[stem] > 1:
            case.name = f"{stem}_{counts[stem]}"


# ---------------------------------------------------------------------------------
# case files
# ---------------------------------------------------------------------------------


def case_to_json(case: Case) -> dict:
    header = {"format": FORMAT, "name": case.name, "source": case.source, "graph": case.graph_name,
              "group": case.group, "moved_bytes": case.moved_bytes,
              "input_ranges": {name: list(r) for name, r in sorted(case.input_ranges.items())}}
    return {"header": header, "graph": case.graph.model_dump(mode="json")}


def case_from_json(data: dict) -> Case:
    """A case file's content back as a Case; its graph is validated (GraphValidationError if not)."""
    header = data["header"]
    if header.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file: format {header.get('format')!r}")
    graph: Graph = parse_graph(data["graph"])
    ranges = {name: (r[0], r[1]) for name, r in header["input_ranges"].items()}
    return Case(header["name"], header["source"], header["graph"], header["group"], graph, header["moved_bytes"], ranges)


def write_cases(cases: list[Case], folder: Path, sources: set[str] | None = None) -> None:
    """One `<name>.json` per case. Case files of an earlier run that are not in this set are removed
    (only those of `sources`, when given: a run over some sources leaves the others' files alone)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = {f"{case.name}.json" for case in cases}
    for path in folder.glob("*.json"):
        old = _read_case_file(path)
        if path.name not in names and old is not None and (sources is None or old["header"]["source"] in sources):
            path.unlink()
    for case in cases:
        (folder / f"{case.name}.json").write_text(json.dumps(case_to_json(case), separators=(",", ":")) + "\n")


def _read_case_file(path: Path) -> dict | None:
    """The decoded content of a case file; None for any other file (JSON of another kind, or none)."""
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return None
    is_case = isinstance(data, dict) and isinstance(data.get("header"), dict) and data["header"].get("format") == FORMAT
    return data if is_case else None


def load_cases(folder: Path = CASES_DIR, wanted: list[str] | None = None) -> list[Case]:
    """The case files of `folder` (other JSON files are skipped), sorted by name; `wanted`:
    substrings of names to keep (all when empty)."""
    cases = []
    for path in sorted(folder.glob("*.json")):
        data = None if wanted and not any(w in path.stem for w in wanted) else _read_case_file(path)
        if data is not None:
            cases.append(case_from_json(data))
    return cases


def case_inputs(case: Case, seed: int = 0, device: str = "cpu") -> list:
    """Random inputs for the case's graph, with its strides, never all zeros, values in its ranges
    (the corpus's way: compiler.fx_import.random_inputs with the ranges as int_ranges)."""
    from compiler.fx_import import random_inputs

    return random_inputs(case.graph, seed=seed, device=device, int_ranges=case.input_ranges)


# ---------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    from bench.model_capture import HELD_OUT_SOURCES, SOURCES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("tiny", "bench"), default="bench")
    parser.add_argument("--out", type=Path, default=CASES_DIR, help="folder for the case files")
    parser.add_argument("--sources", default="", help=f"comma-separated subset of {','.join(SOURCES)} "
                        "(dedupe then spans only those; the checked-in set is a run over all), or held-out "
                        f"models: {','.join(HELD_OUT_SOURCES)}")
    parser.add_argument("--exclude-dir", type=Path, action="append", default=[],
                        help="leave out cases that duplicate one in this folder (a held-out set: --exclude-dir "
                             "bench/cases); may be given more than once")
    parser.add_argument("--whole-graphs", action="store_true", help="add each captured graph as one case too")
    parser.add_argument("--channels-last", choices=("off", "auto", "on"), default="off",
                        help="rewrite convolutions as the backend's channels_last setting does (docs/CLIENT.md); "
                             "bench/cases is captured with off, bench/channels_last with auto on the GPU")
    parser.add_argument("--capture-limit-s", type=float, default=CAPTURE_LIMIT_S,
                        help="seconds one source's capture may take; a longer one is reported as not cut")
    parser.add_argument("--jobs", type=int, default=1,
                        help="capture this many sources at a time, each in its own process (the set is the same)")
    parser.add_argument("--one-per-family", type=int, metavar="MIN_BYTES", default=None,
                        help="keep, of cases moving at least MIN_BYTES, the largest of each family "
                             "(same ops in order and input dtypes, any sizes)")
    args = parser.parse_args(argv)
    sources = [s for s in args.sources.split(",") if s] or None
    known = [case for folder in args.exclude_dir for case in load_cases(folder)]
    result = extract_cases(args.size, sources, args.whole_graphs, progress=lambda line: print(line, flush=True),
                           known=known, channels_last=args.channels_last, capture_limit_s=args.capture_limit_s,
                           jobs=args.jobs)
    if args.one_per_family is not None:
        result.cases = one_per_family(result.cases, args.one_per_family)
    write_cases(result.cases, args.out, set(result.reports))
    groups = sum(r.groups for r in result.reports.values())
    duplicates = sum(r.duplicates for r in result.reports.values())
    print(f"{len(result.cases)} cases kept ({groups} kernel-group cases cut, {duplicates} duplicates dropped) "
          f"-> {args.out}")
    if any(r.failed for r in result.reports.values()):
        sys.exit("some graphs could not be cut into cases (NOT CUT above); the set lacks their cases")


if __name__ == "__main__":
    main()
