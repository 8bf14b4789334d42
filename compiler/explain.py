"""Human-readable account of how a graph was compiled: kernels, the nodes and wire ops
fused into each, how launch configs and uncertain fusions were decided (on a GPU worker, by
timing), and every fusion the scheduler refused with its reason."""

from __future__ import annotations

from compiler.artifact import Artifact
from compiler.graph import Graph
from compiler.options import CompileOptions


def explain(graph: Graph, target: str = "cpu", options: CompileOptions | dict | None = None) -> str:
    import compiler

    return describe(compiler.compile(graph, target, options))


def describe(artifact: Artifact) -> str:
    manifest = artifact.manifest
    plan = manifest["plan"]
    lines = [f"key {manifest['key']}  target {manifest['target']}",
             f"{len(manifest['kernels'])} kernels, "
             f"{sum(1 for s in plan['steps'] if s['op'] == 'extern')} extern calls, "
             f"planned peak {plan['peak_bytes']} bytes", ""]
    for kernel in manifest["kernels"]:
        config = kernel["config"]
        shape = f"{kernel['numel']}" + (f" x {kernel['rnumel']}" if kernel["rnumel"] > 1 else "")
        if config.get("phases"):
            kind = f"{len(config['phases'])} single-program kernels in turn, one launch"
        elif config.get("parts"):
            kind = f"{len(config['parts'])} reductions' first passes side by side, one launch"
        elif config.get("lanes"):
            kind = "pointwise in pairs of outputs"
        elif config.get("unrolled"):
            kind = f"pointwise in cells of {config['unrolled']} outputs"
        elif config.get("tiled"):
            kind = "2D-tiled pointwise"
        elif kernel["rnumel"] > 1:
            kind = "persistent reduction" if config.get("persistent") else "looped reduction"
        else:
            kind = "pointwise"
        steps = config.get("loop_stages", 1) - 1  # a pipelined loop (codegen.group.loop_header)
        ahead = f", loads {steps} step{'s' if steps > 1 else ''} ahead" if steps else ""
        lines.append(f"{kernel['name']}: {kind} over {shape}, "
                     f"XBLOCK={config['XBLOCK']} RBLOCK={config['RBLOCK']}{ahead}")
        lines.append(f"    IR nodes {', '.join(kernel['nodes'])}")
        lines.append(f"    from wire nodes {', '.join(kernel['origins'])}")
        if kernel.get("autotune"):
            trials = kernel["autotune"]
            timings = ", ".join("does not load" if ms is None else f"{ms:.4f}" for ms in trials["ms"])
            lines.append(f"    tuned: candidate {trials['chosen']} of {len(trials['ms'])} ({timings} ms)"
                         + (" from the tuning cache" if trials["cached"] else ""))
    externs = [s for s in plan["steps"] if s["op"] == "extern"]
    for step in externs:
        lines.append(f"extern {step['target']} -> {', '.join(step['outputs'])}")
    fusion = manifest["fusion"]
    lines += ["", f"launch configs: {manifest.get('autotune', 'heuristics')}",
              f"uncertain fusions: {fusion.get('benchmark_note', 'decided by the score')}"]
    lines += [f"    {d['node1']} + {d['node2']}: {d['reason']} ({d['why_benchmarked']})" for d in fusion.get("benchmarked", [])]
    refused = fusion["refused"]
    lines += ["", f"fusions refused ({len(refused)}):"]
    lines += [f"    {r['node1']} + {r['node2']}: {r['reason']}" for r in refused] or ["    none"]
    return "\n".join(lines)
