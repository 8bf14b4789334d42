"""The `fusewire` command.

    fusewire up                          whole local stack: redis-server + worker + API
    fusewire serve | worker              one part of it
    fusewire compile graph.json -o a.fwa [--local]
    fusewire compile mymodel:step -o a.fwa       capture a Python function (see _capture)
    fusewire fetch KEY -o a.fwa
    fusewire keygen -o signing.pem       a worker's artifact-signing key pair (docs/TRUST.md)
    fusewire status | explain graph.json

Global: --url / --token (env FUSEWIRE_URL, FUSEWIRE_TOKEN); --json for machine output
(before or after the subcommand). torch is imported only by the commands that compile
locally or start a worker, so `fusewire status` stays fast.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from client.http import DEFAULT_URL, ArtifactVerificationError, CompileFailed, FusewireClient, ServiceError

app = typer.Typer(name="fusewire", help="Shared compilation service for PyTorch training.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable JSON on stdout")]
Target = Annotated[str, typer.Option("--target", "-t", help="'cpu' or 'cuda:sm_XY'")]
Options = Annotated[Optional[str], typer.Option("--options", help="compile options as JSON, or @file.json")]
GraphSpec = Annotated[str, typer.Argument(
    help="wire-format graph JSON file, or module:function (file.py:function) whose example inputs come from "
         "function.example_inputs or the module's example_inputs()")]


class State:
    url: str = DEFAULT_URL
    token: str | None = None
    json: bool = False


state = State()


@app.callback()
def _global(
    url: Annotated[str, typer.Option("--url", envvar="FUSEWIRE_URL", help="the service")] = DEFAULT_URL,
    token: Annotated[Optional[str], typer.Option("--token", envvar="FUSEWIRE_TOKEN", help="bearer token")] = None,
    as_json: JsonFlag = False,
) -> None:
    state.url, state.token, state.json = url, token, as_json


def main() -> None:
    app()


# -- helpers ------------------------------------------------------------------------


def _emit(data: Any, as_json: bool) -> bool:
    """Prints `data` as JSON when asked; returns whether it did."""
    if as_json or state.json:
        print(json.dumps(data, indent=1, default=str))
        return True
    return False


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def _client() -> FusewireClient:
    return FusewireClient(state.url, state.token)


def _read_options(options: str | None) -> dict | None:
    if not options:
        return None
    text = Path(options[1:]).read_text() if options.startswith("@") else options
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(f"--options is not JSON: {exc}", 2) from None


def _read_graph(path: Path):
    from compiler.graph import GraphValidationError, parse_graph

    try:
        return parse_graph(path.read_bytes())
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc}", 2) from None
    except GraphValidationError as exc:
        raise _fail(f"{path}: {exc}", 2) from None


def _is_function_spec(spec: str) -> bool:
    return ":" in spec and not Path(spec).is_file()


def _capture(spec: str):
    """`module:function` (or `path/file.py:function`) -> wire Graph, traced with make_fx.

    Example inputs: the function's attribute `example_inputs`, else the module's
    `example_inputs`; either a sequence of tensors or a callable returning one (or one tensor).
    The function takes tensors and returns tensors (parameters are inputs, not module attributes)."""
    import importlib

    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py"):
            file = Path(module_name).resolve()
            module_spec = importlib.util.spec_from_file_location(file.stem, file)
            if module_spec is None:
                raise ImportError(f"cannot load {file}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[file.stem] = module
            module_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` would find it
            module = importlib.import_module(module_name)
        function = module
        for part in attr.split("."):
            function = getattr(function, part)
    except (ImportError, AttributeError, OSError) as exc:
        raise _fail(f"cannot import {spec}: {type(exc).__name__}: {exc}", 2) from None
    source = getattr(function, "example_inputs", None)
    if source is None:
        source = getattr(module, "example_inputs", None)
    if source is None:
        raise _fail(f"{spec}: give the function an `example_inputs` attribute or define example_inputs() in "
                    f"{module_name}, returning the tensors to trace it with", 2)
    inputs = source() if callable(source) else source
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from compiler.fx_import import ConversionError, from_fx

    inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    try:
        return from_fx(make_fx(function)(*inputs), inputs)
    except ConversionError as exc:
        raise _fail(f"{spec}: {exc}", 2) from None


def _kernel_table(manifest: dict) -> Table:
    table = Table(title=f"{len(manifest.get('kernels', []))} kernels", title_justify="left")
    table.add_column("kernel")
    table.add_column("source")
    table.add_column("details", overflow="fold")
    for kernel in manifest.get("kernels", []):
        details = {k: v for k, v in kernel.items() if k not in ("name", "source") and not isinstance(v, (dict, list))}
        table.add_row(str(kernel.get("name")), str(kernel.get("source")), " ".join(f"{k}={v}" for k, v in details.items()))
    return table


def _kernels(manifest: dict) -> list[dict]:
    return [{k: v for k, v in kernel.items()} for kernel in manifest.get("kernels", [])]


def _progress():
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description:<12}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                    console=err, transient=True)


# -- stack --------------------------------------------------------------------------


@app.command()
def up(
    host: Annotated[str, typer.Option(help="API address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port (0: any free port)")] = 8000,
    redis_url: Annotated[Optional[str], typer.Option(envvar=["FUSEWIRE_REDIS_URL", "REDIS_URL"],
                                                     help="use this Redis instead of starting one")] = None,
    redis_port: Annotated[int, typer.Option(help="port of our own redis-server (0: any free port)")] = 0,
    state_dir: Annotated[Path, typer.Option(help="redis data, logs, example graph")] = Path(".fusewire"),
    target: Annotated[list[str], typer.Option("--target", "-t", help="targets the worker compiles for")] = ["cpu"],
    concurrency: Annotated[int, typer.Option(help="compiles at once in the worker")] = 1,
    api_workers: Annotated[int, typer.Option(help="uvicorn worker processes")] = 1,
    signing_key: Annotated[Optional[Path], typer.Option(
        help="the worker's signing key (default: STATE_DIR/keys/dev-signing.pem, made on first start)")] = None,
    trust: Annotated[bool, typer.Option(help="add the signing key to this machine's trusted keys "
                                             "(FUSEWIRE_TRUSTED_KEYS_FILE, default ~/.config/fusewire/trusted_keys)")] = True,
    as_json: JsonFlag = False,
) -> None:
    """Start the whole local stack (redis-server, a Celery worker, the API); Ctrl-C stops it all."""
    from client.stack import Stack, StackConfig, StackError

    stack = Stack(StackConfig(host=host, port=port, redis_url=redis_url, redis_port=redis_port, state_dir=state_dir,
                              targets=target, worker_concurrency=concurrency, api_workers=api_workers,
                              signing_key=signing_key, trust_dev_key=trust))

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        if not (as_json or state.json):
            err.print(f"starting redis-server, worker ({', '.join(target)}) and API; logs in {stack.logs}/ ...")
        stack.start()
        _announce(stack, as_json)
        stack.watch()
    except KeyboardInterrupt:
        err.print("stopping: API, worker, redis-server ...")
    except StackError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        stack.stop()
        raise typer.Exit(1)
    stack.stop()
    err.print("stopped.")


def _announce(stack, as_json: bool) -> None:
    example = Path(stack.config.state_dir) / "example-graph.json"
    info = {"url": stack.url, "docs": stack.url + "/docs", "redis_url": stack.redis_url,
            "worker": stack.worker_name, "logs": str(stack.logs), "example_graph": str(example),
            "signing_key": str(stack.signing_key), "key_id": stack.key_id,
            "trusted_in": str(stack.trusted_in) if stack.trusted_in else None}
    if as_json or state.json:
        print(json.dumps(info), flush=True)  # one line: scripts read it as soon as the stack is up
        return
    out.print(f"\n[bold green]fusewire is up[/]  {stack.url}   (API docs: {stack.url}/docs)", highlight=False)
    out.print(f"  redis   {stack.redis_url}\n  worker  {stack.worker_name}\n  logs    {stack.logs}/", highlight=False)
    trusted = f"trusted in {stack.trusted_in}" if stack.trusted_in else "NOT trusted by clients (--no-trust)"
    out.print(f"  signs   with key {stack.key_id} ({stack.signing_key}), {trusted}\n", highlight=False)
    out.print("Try it (in another terminal):", highlight=False)
    out.print(f"  export FUSEWIRE_URL={stack.url}\n"
              f"  fusewire status\n"
              f"  fusewire compile {example} -o example.fwa\n"
              f"  curl -s {stack.url}/compile -H 'content-type: application/json' "
              f"-d \"{{\\\"graph\\\": $(cat {example}), \\\"target\\\": \\\"cpu\\\"}}\"\n", highlight=False, soft_wrap=True)
    out.print("Ctrl-C stops everything.", highlight=False)
    sys.stdout.flush()


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes")] = 1,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Run the API only (uvicorn service.app:app); settings from FUSEWIRE_* env."""
    import uvicorn

    metrics_dir = None
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # counters from every worker process in one /metrics (prometheus-client multiprocess mode)
        metrics_dir = tempfile.mkdtemp(prefix="fusewire-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        uvicorn.run("service.app:app", host=host, port=port, workers=workers, log_level=log_level,
                    access_log=False, timeout_graceful_shutdown=10)
    finally:
        if metrics_dir is not None:  # ours, not one the operator set: gone with the server
            shutil.rmtree(metrics_dir, ignore_errors=True)


@app.command()
def worker(
    target: Annotated[list[str], typer.Option("--target", "-t",
                                              help="targets to compile for; 'auto': this machine's GPU arch, else cpu")] = ["auto"],
    concurrency: Annotated[int, typer.Option(help="compiles at once")] = 1,
    pool: Annotated[str, typer.Option(help="Celery pool: prefork (time limits work) or solo")] = "prefork",
    name: Annotated[Optional[str], typer.Option(help="Celery node name")] = None,
    loglevel: Annotated[str, typer.Option(help="log level")] = "info",
) -> None:
    """Run a compile worker (Celery) consuming the queues of its targets."""
    from compiler.graph import GraphValidationError, validate_target
    from compiler.signing import KeyFileError, key_id, load_private_key
    from compiler.version import check_toolchain
    from service.settings import get_settings
    from worker.config import queue_for

    try:
        check_toolchain()
    except RuntimeError as exc:
        raise _fail(str(exc)) from None
    key_file = get_settings().signing_key_file
    if key_file is None:
        raise _fail("no signing key: set FUSEWIRE_SIGNING_KEY_FILE (make one with `fusewire keygen`; docs/TRUST.md)", 2)
    try:
        signer = key_id(load_private_key(key_file).public_key())
    except KeyFileError as exc:
        raise _fail(str(exc), 2) from None
    targets = [t for spec in target for t in (_auto_targets() if spec == "auto" else [spec])]
    for t in targets:
        try:
            validate_target(t)
        except GraphValidationError as exc:
            raise _fail(str(exc), 2) from None
    if targets == ["cpu"]:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from worker.app import app as celery_app

    argv = ["worker", "-Q", ",".join(queue_for(t) for t in targets), "--pool", pool, "--concurrency", str(concurrency),
            "-l", loglevel, "--without-gossip", "--without-mingle"]
    if name:
        argv += ["-n", name]
    err.print(f"worker for {', '.join(targets)}, signing with key {signer}", highlight=False)
    celery_app.worker_main(argv)


def _auto_targets() -> list[str]:
    import torch

    if torch.cuda.is_available():
        from client.cubin import cuda_target

        return [cuda_target()]
    return ["cpu"]


# -- compile, fetch, status, explain ------------------------------------------------------


@app.command("compile")
def compile_cmd(
    graph: GraphSpec,
    output: Annotated[Optional[Path], typer.Option("--output", "-o",
                                                   help="artifact file (default: GRAPH.fwa, or FUNCTION.fwa)")] = None,
    target: Target = "cpu",
    options: Options = None,
    local: Annotated[bool, typer.Option("--local", help="compile in this process, no service needed")] = False,
    sign_key: Annotated[Optional[Path], typer.Option(
        help="--local: sign the artifact with this key (clients load only signed artifacts)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the service's compile")] = 600.0,
    as_json: JsonFlag = False,
) -> None:
    """Compile a graph file or a Python function (on the service, or --local in-process); write the artifact."""
    opts = _read_options(options)
    quiet = as_json or state.json
    if _is_function_spec(graph):
        parsed = _capture(graph)
        output = output or Path(graph.rpartition(":")[2] + ".fwa")
        payload = parsed.model_dump(mode="json")
    else:
        path = Path(graph)
        if not path.is_file():
            raise _fail(f"{graph}: no such file (and not module:function)", 2)
        output = output or path.with_suffix(".fwa")
        parsed = _read_graph(path) if local else None
        payload = None if local else _read_json(path)  # sent as it is: the service says what is wrong, and where
    if local:
        blob, manifest = _compile_local(parsed, target, opts, quiet, sign_key)
    else:
        blob, manifest = _compile_remote(payload, target, opts, timeout, quiet)
    output.write_bytes(blob)
    result = {"key": manifest.get("key"), "target": target, "output": str(output), "bytes": len(blob),
              "kernels": _kernels(manifest)}
    if not _emit(result, as_json):
        out.print(f"key     {result['key']}\nwrote   {output} ({len(blob)} bytes)", highlight=False)
        out.print(_kernel_table(manifest))


def _compile_local(graph, target: str, options: dict | None, quiet: bool, sign_key: Path | None) -> tuple[bytes, dict]:
    import compiler
    from compiler.signing import KeyFileError, load_private_key, sign_artifact

    try:
        signer = load_private_key(sign_key) if sign_key else None
    except KeyFileError as exc:
        raise _fail(str(exc), 2) from None

    try:
        if quiet:
            artifact = compiler.compile(graph, target, options)
        else:
            with _progress() as bar:
                task = bar.add_task("lowering", total=1.0)
                artifact = compiler.compile(graph, target, options,
                                            progress=lambda stage, f: bar.update(task, description=stage, completed=f))
    except Exception as exc:  # the compiler's own error, shown as such
        raise _fail(f"compile failed: {type(exc).__name__}: {exc}") from None
    if signer is not None:
        sign_artifact(artifact, signer)
    elif not quiet:
        err.print("note: the artifact is unsigned (--sign-key); clients refuse to load it", highlight=False)
    return artifact.to_bytes(), artifact.manifest


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise _fail(f"cannot read {path} as JSON: {exc}", 2) from None


def _compile_remote(payload: Any, target: str, options: dict | None, timeout: float, quiet: bool) -> tuple[bytes, dict]:
    from compiler.artifact import Artifact

    with _client() as client:
        try:
            submission = client.submit(payload, target, options)
            if submission.state != "ready":
                if quiet:
                    client.wait(submission.key, timeout)
                else:
                    with _progress() as bar:
                        task = bar.add_task(submission.state, total=1.0)
                        client.wait(submission.key, timeout, on_progress=lambda job: bar.update(
                            task, description=job.get("stage") or job["state"], completed=job.get("progress") or 0))
            blob = client.fetch_bytes(submission.key)
        except ServiceError as exc:
            where = f" (at {exc.where})" if exc.where else ""
            raise _fail(f"{exc.detail}{where} [{exc.status} {exc.error}]") from None
        except CompileFailed as exc:
            raise _fail(f"compile failed: {exc.job.get('error')}") from None
        except (TimeoutError, ArtifactVerificationError) as exc:
            raise _fail(str(exc)) from None
    return blob, Artifact.from_bytes(blob).manifest


@app.command()
def fetch(
    key: Annotated[str, typer.Argument(help="artifact key (64 hex digits)")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="file (default: KEY.fwa)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Download an artifact by key (digest, key and signature verified) to a file."""
    output = output or Path(f"{key}.fwa")
    with _client() as client:
        try:
            blob = client.fetch_bytes(key)
        except ServiceError as exc:
            raise _fail(f"{exc.detail} [{exc.status} {exc.error}]") from None
        except ArtifactVerificationError as exc:
            raise _fail(str(exc)) from None
    output.write_bytes(blob)
    if not _emit({"key": key, "output": str(output), "bytes": len(blob)}, as_json):
        out.print(f"wrote {output} ({len(blob)} bytes)", highlight=False)


@app.command()
def keygen(
    output: Annotated[Path, typer.Option("--output", "-o", help="private key file (PEM); the public key goes "
                                                                 "to OUTPUT.pub")] = Path("fusewire-signing.pem"),
    trust: Annotated[bool, typer.Option(help="also add the public key to this machine's trusted keys")] = False,
    force: Annotated[bool, typer.Option(help="overwrite an existing key file")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Make an Ed25519 key pair for a worker to sign artifacts with (docs/TRUST.md)."""
    from compiler.signing import add_trusted_key, default_trusted_keys_file, generate_key, key_id, public_line, \
        write_private_key

    if output.exists() and not force:
        raise _fail(f"{output} exists (--force overwrites it; clients that trust its key would refuse new artifacts)", 2)
    private = generate_key()
    public = private.public_key()
    write_private_key(private, output)
    line = public_line(public, f"fusewire worker key {output.name}")
    output.with_suffix(output.suffix + ".pub").write_text(line + "\n")
    trusted_in = None
    if trust:
        trusted_in = Path(os.environ.get("FUSEWIRE_TRUSTED_KEYS_FILE") or default_trusted_keys_file()).expanduser()
        add_trusted_key(trusted_in, public, f"fusewire worker key {output.resolve()}")
    result = {"key_id": key_id(public), "private": str(output), "public": line,
              "trusted_in": str(trusted_in) if trusted_in else None}
    if not _emit(result, as_json):
        out.print(f"key id   {result['key_id']}\nprivate  {output} (workers: FUSEWIRE_SIGNING_KEY_FILE)\n"
                  f"public   {line}\n         (clients: a line of FUSEWIRE_TRUSTED_KEYS_FILE, or FUSEWIRE_TRUSTED_KEYS)",
                  highlight=False, soft_wrap=True)
        if trusted_in:
            out.print(f"trusted in {trusted_in}", highlight=False)


@app.command()
def status(as_json: JsonFlag = False) -> None:
    """Service health: Redis, live workers, queue depths. Exit 1 when not ready, 2 when unreachable."""
    with _client() as client:
        try:
            health = client.health()
            ready = client.readiness()
        except ServiceError as exc:
            if not _emit({"url": state.url, "reachable": False, "error": exc.detail}, as_json):
                err.print(f"[bold red]unreachable:[/] {exc.detail}", highlight=False)
            raise typer.Exit(2)
    report = {"url": state.url, "reachable": True, "version": health.get("version"), **ready}
    if not _emit(report, as_json):
        mark = "[bold green]ready[/]" if ready["ready"] else "[bold red]not ready[/]"
        out.print(f"{state.url}  fusewire {health.get('version')}  {mark}  auth={ready.get('auth')}  "
                  f"redis={'ok' if ready.get('redis') else 'DOWN'}  active jobs={ready.get('active_jobs', 0)}", highlight=False)
        for problem in ready.get("problems", []):
            out.print(f"  problem: {problem}", highlight=False)
        table = Table("worker", "queues", "seen")
        for w in ready.get("workers", []):
            table.add_row(w["hostname"], ", ".join(w.get("queues", [])), f"{w['seen_s_ago']} s ago")
        out.print(table)
        queues = Table("queue", "waiting")
        for name, depth in ready.get("queues", {}).items():
            queues.add_row(name, str(depth))
        out.print(queues)
    if not ready["ready"]:
        raise typer.Exit(1)


@app.command()
def explain(
    graph: GraphSpec,
    target: Target = "cpu",
    as_json: JsonFlag = False,
) -> None:
    """Why the compiler fused what it fused (compiler.explain, else the manifest's fusion log)."""
    if _is_function_spec(graph):
        parsed = _capture(graph)
    elif Path(graph).is_file():
        parsed = _read_graph(Path(graph))
    else:
        raise _fail(f"{graph}: no such file (and not module:function)", 2)
    if importlib.util.find_spec("compiler.explain") is not None:
        from compiler.explain import explain as explain_graph

        takes_target = "target" in inspect.signature(explain_graph).parameters
        text = explain_graph(parsed, target) if takes_target else explain_graph(parsed)
        if not _emit({"explain": text}, as_json):
            print(text)
        return
    import compiler

    try:
        artifact = compiler.compile(parsed, target)
    except Exception as exc:
        raise _fail(f"compile failed: {type(exc).__name__}: {exc}") from None
    fusion = artifact.manifest.get("fusion")
    if not _emit({"key": artifact.key, "fusion": fusion}, as_json):
        print(json.dumps(fusion, indent=1, default=str))


if __name__ == "__main__":
    main()
