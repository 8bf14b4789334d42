"""What the fusewire backend adds to the first call of a compiled transformer block on a cache hit.

    python bench/client_first_call.py                       # starts its own stack (redis + worker + API)
    python bench/client_first_call.py --url http://127.0.0.1:8000 --token T
    python bench/client_first_call.py --device cuda --d-model 256 --seq 128 --batch 8

Every measurement is a fresh Python process (cold dynamo, cold imports of the kernels), run
`--repeats` times; medians are printed. Modes, each timing `model(x)`'s first call (a forward
with parameters that require grad, as in training) after `import torch` and building the model:

  eager        plain PyTorch
  aot_only     torch.compile with aot_autograd whose fw/bw compilers return the graph as it is
               (like backend="aot_eager", without the debug asserts aot_eager turns on): dynamo +
               aot_autograd and no compiler, what any aot_autograd-based backend pays first.
  service_hit  torch.compile(backend=fusewire) with an empty local cache; the artifact is in the
               service already (a warm-up process put it there): probe + fetch + verify + save + load
  local_hit    the same with the local cache filled: no network

"added" = mode - eager. The backend's own share (convert, artifact, load, first kernel run) is
reported from `Backend.seconds`, so dynamo's part can be told apart from fusewire's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("eager", "aot_only", "service_hit", "local_hit")


def child(args: argparse.Namespace) -> None:
    """One measurement in this (fresh) process; prints one JSON line."""
    started = time.perf_counter()
    import torch

    imported = time.perf_counter() - started

    sys.path.insert(0, str(ROOT))
    from tests.client.client_models import Block  # the transformer block the client tests train

    torch.manual_seed(0)
    model = Block(args.d_model, args.heads).to(args.device)
    x = torch.randn(args.batch, args.seq, args.d_model, device=args.device)
    be = None
    if args.child == "eager":
        run = model
    elif args.child == "aot_only":
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        as_is = lambda gm, example_inputs: make_boxed_func(gm)  # noqa: E731
        run = torch.compile(model, backend=aot_autograd(fw_compiler=as_is, bw_compiler=as_is))
    else:
        from client.backend import backend

        be = backend(url=args.url, token=args.token, cache_dir=args.cache_dir, on_error="raise")
        run = torch.compile(model, backend=be)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = run(x)
    sync()
    first = time.perf_counter() - start
    start = time.perf_counter()
    run(x)
    sync()
    second = time.perf_counter() - start
    error = (out - model(x)).abs().max().item()
    report = {"mode": args.child, "first_ms": first * 1e3, "second_ms": second * 1e3, "import_s": imported,
              "max_error": error}
    if be is not None:
        report["stats"] = dict(be.stats)
        report["backend_ms"] = {k: v * 1e3 for k, v in be.seconds.items()}
    print(json.dumps(report))


def measure(args: argparse.Namespace, mode: str, cache_dir: Path) -> dict:
    argv = [sys.executable, __file__, "--child", mode, "--url", args.url, "--cache-dir", str(cache_dir),
            "--device", args.device, "--d-model", str(args.d_model), "--heads", str(args.heads),
            "--seq", str(args.seq), "--batch", str(args.batch)]
    if args.token:
        argv += ["--token", args.token]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if args.device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env["FUSEWIRE_CACHE_DIR"] = str(cache_dir)  # the runtime's kernel files, cold as well
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running service (default: start one)")
    parser.add_argument("--token", default=os.environ.get("FUSEWIRE_TOKEN"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    stack = None
    if args.url is None:
        sys.path.insert(0, str(ROOT))
        from client.stack import Stack, StackConfig

        state = Path(tempfile.mkdtemp(prefix="fusewire-bench-"))
        target = "cpu" if args.device == "cpu" else "auto"
        stack = Stack(StackConfig(port=0, state_dir=state, targets=[target], trust_file=state / "trusted_keys"))
        print(f"starting a stack in {state} ...", file=sys.stderr)
        stack.start()
        os.environ["FUSEWIRE_TRUSTED_KEYS_FILE"] = str(stack.trusted_in)  # children inherit it
        args.url = stack.url
    try:
        with tempfile.TemporaryDirectory(prefix="fusewire-bench-cache-") as tmp:
            warm = measure(args, "service_hit", Path(tmp) / "warm")  # puts the artifacts in the service
            print(f"warm-up: {warm['stats']}", file=sys.stderr)
            runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
            filled = Path(tmp) / "filled"
            measure(args, "service_hit", filled)
            for i in range(args.repeats):
                for mode in MODES:
                    cache = filled if mode == "local_hit" else Path(tmp) / f"{mode}-{i}"
                    runs[mode].append(measure(args, mode, cache))
        report(args, runs)
    finally:
        if stack is not None:
            stack.stop()
            shutil.rmtree(stack.config.state_dir, ignore_errors=True)


def report(args: argparse.Namespace, runs: dict[str, list[dict]]) -> None:
    median = lambda values: statistics.median(values)  # noqa: E731
    eager = median([r["first_ms"] for r in runs["eager"]])
    print(f"transformer block d_model={args.d_model} heads={args.heads} seq={args.seq} batch={args.batch} "
          f"on {args.device}, {args.repeats} fresh processes per mode, medians")
    print(f"{'mode':<12} {'first call ms':>14} {'added ms':>9} {'second call ms':>15}  backend's own ms "
          "(convert / artifact / load / first run)  stats")
    for mode in MODES:
        first = median([r["first_ms"] for r in runs[mode]])
        second = median([r["second_ms"] for r in runs[mode]])
        own = ""
        stats = ""
        if "backend_ms" in runs[mode][0]:
            phases = ("convert", "artifact", "load", "first_run")
            own = " / ".join(f"{median([r['backend_ms'].get(p, 0.0) for r in runs[mode]]):.1f}" for p in phases)
            stats = json.dumps(runs[mode][0]["stats"])
        print(f"{mode:<12} {first:>14.1f} {first - eager:>9.1f} {second:>15.1f}  {own:<40} {stats}")
    worst = max(r["max_error"] for rs in runs.values() for r in rs)
    print(f"largest |compiled - eager| over all runs: {worst:.2e}")


if __name__ == "__main__":
    main()
