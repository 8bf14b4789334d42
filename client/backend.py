"""The `torch.compile` backend: each ATen graph of a training step compiled by the service.

    model = torch.compile(model, backend="fusewire")                    # settings from the env
    model = torch.compile(model, backend=client.backend.backend(url=..., timeout_s=60))

aot_autograd splits what dynamo captures into a forward and a backward ATen graph and
hands each to `compile_graph`:

    fx graph --from_fx--> wire Graph --key--> local cache <cache_dir>/artifacts/<key>.fwa
                                              | miss
                                              v
                                  HEAD/GET /artifacts/{key}, else POST /compile + wait
                                              |  (digest and key verified, saved locally)
                                              v
                                  runtime.load(artifact) -> GraphFunction

A `GraphFunction` keeps one compiled variant per input signature (shapes, strides, dtypes,
devices, non-tensor values): inputs it has not seen compile again, through the same cache
and service. Graphs with symbolic sizes or non-tensor inputs (dynamo's dynamic shapes) are
specialised per signature at call time (re-traced with make_fx on the concrete inputs).

Never breaks training: whatever goes wrong for a graph (conversion, service unreachable or
slow past `timeout_s`, a 4xx/5xx, a failed job, an artifact failing verification, an error
on its first run), ONE `FusewireWarning` names the graph and the reason and the graph runs
eagerly (the aot graph module itself) from then on; `on_error="raise"` raises `FusewireError`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.utils import _pytree as pytree

from client import default_cache_dir
from client.linear_groups import group_linears
from client.local_ops import SplitFunction, split_at_local_ops
from client.channels_last import MODES as CHANNELS_LAST_MODES, use_channels_last
from client.cubin import cuda_target
from client.partition import PARTITIONERS, aot_options

DEFAULT_TIMEOUT_S = 120.0
UNREACHABLE_BACKOFF_S = 30.0  # after a connection failure, later graphs skip the network this long
ON_ERROR = ("eager", "raise")

log = logging.getLogger("fusewire.backend")


class FusewireWarning(UserWarning):
    """A graph runs eagerly instead of compiled; the message says which graph and why."""


class FusewireError(RuntimeError):
    """Raised instead of falling back when the backend is configured with on_error="raise"."""


# -- settings -------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendSettings:
    url: str
    token: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    on_error: str = "eager"
    cache_dir: Path = field(default_factory=default_cache_dir)
    options: dict | None = None  # compiler.CompileOptions fields; part of the key
    partitioner: str = "min_cut"  # how aot_autograd splits forward from backward (PARTITIONERS)
    cuda_graphs: bool = False  # replay each CUDA graph function's launches as a CUDA graph (client/cudagraphs.py)
    group_linears: bool = True  # linears over one input become one GEMM before autograd (client/linear_groups.py)
    channels_last: str = "auto"  # convolutions on channels-last tensors (client/channels_last.py MODES)

    @classmethod
    def from_env(cls, **overrides: Any) -> "BackendSettings":
        """FUSEWIRE_URL, FUSEWIRE_TOKEN, FUSEWIRE_TIMEOUT_S, FUSEWIRE_ON_ERROR, FUSEWIRE_CACHE_DIR,
        FUSEWIRE_PARTITIONER, FUSEWIRE_CUDA_GRAPHS, FUSEWIRE_GROUP_LINEARS (1/true/yes/on, else off),
        FUSEWIRE_CHANNELS_LAST (auto/on/off); None = default."""
        from client.http import DEFAULT_URL

        env = os.environ
        settings = cls(
            url=env.get("FUSEWIRE_URL") or DEFAULT_URL,
            token=env.get("FUSEWIRE_TOKEN") or None,
            timeout_s=float(env.get("FUSEWIRE_TIMEOUT_S") or DEFAULT_TIMEOUT_S),
            on_error=env.get("FUSEWIRE_ON_ERROR") or "eager",
            partitioner=env.get("FUSEWIRE_PARTITIONER") or "min_cut",
            cuda_graphs=_flag(env.get("FUSEWIRE_CUDA_GRAPHS"), False),
            group_linears=_flag(env.get("FUSEWIRE_GROUP_LINEARS"), True),
            channels_last=env.get("FUSEWIRE_CHANNELS_LAST") or "auto",
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        if "cache_dir" in given:
            given["cache_dir"] = Path(given["cache_dir"]).expanduser()
        settings = replace(settings, **given)
        if settings.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, not {settings.on_error!r}")
        if settings.partitioner not in PARTITIONERS:
            raise ValueError(f"partitioner must be one of {sorted(PARTITIONERS)}, not {settings.partitioner!r}")
        if settings.channels_last not in CHANNELS_LAST_MODES:
            raise ValueError(f"channels_last must be one of {CHANNELS_LAST_MODES}, not {settings.channels_last!r}")
        if settings.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {settings.timeout_s}")
        return settings


def _flag(value: str | None, default: bool) -> bool:
    """An environment switch: unset or empty is `default`; 1/true/yes/on is on, anything else off."""
    if not (value or "").strip():
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def backend(url: str | None = None, token: str | None = None, timeout_s: float | None = None,
            on_error: str | None = None, cache_dir: str | Path | None = None,
            options: dict | None = None, partitioner: str | None = None, cuda_graphs: bool | None = None,
            group_linears: bool | None = None, channels_last: str | None = None) -> "Backend":
    """A configured backend for `torch.compile(model, backend=...)`; unset arguments come from the env."""
    return Backend(BackendSettings.from_env(url=url, token=token, timeout_s=timeout_s, on_error=on_error,
                                            cache_dir=cache_dir, options=options, partitioner=partitioner,
                                            cuda_graphs=cuda_graphs, group_linears=group_linears,
                                            channels_last=channels_last))


def fusewire_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None,
                     **_: Any) -> Callable:
    """The registered backend (`torch.compile(m, backend="fusewire", options={...})`).

    `options` may hold backend()'s arguments (url, token, timeout_s, on_error, cache_dir, partitioner,
    cuda_graphs, group_linears, channels_last) and
    `compile_options` (the compiler's options); everything else comes from the environment."""
    options = dict(options or {})
    compile_options = options.pop("compile_options", None)
    unknown = set(options) - {"url", "token", "timeout_s", "on_error", "cache_dir", "partitioner", "cuda_graphs",
                              "group_linears", "channels_last"}
    if unknown:
        raise ValueError(f"unknown fusewire backend options {sorted(unknown)}")
    settings = BackendSettings.from_env(options=compile_options, **options)
    # one Backend per distinct settings: its HTTP connection, stats and unreachable-service memory are shared
    name = json.dumps(asdict(settings), sort_keys=True, default=str)
    if name not in _SHARED:
        _SHARED[name] = Backend(settings)
    return _SHARED[name](gm, example_inputs)


_SHARED: dict[str, "Backend"] = {}

# -- the backend ----------------------------------------------------------------------


class Backend:
    """Callable as a dynamo backend. `stats` counts what happened (graphs, local_hits, remote_hits,
    compiles, recompiles, fallbacks, grouped_linears, channels_last_convs; in CUDA-graph mode
    cuda_graphs_captured, cuda_graph_replays, cuda_graph_plain_runs and cuda_graph_fallbacks;
    local_ops: ops run in this process between compiled parts, client/local_ops.py);
    `seconds` sums the time spent per phase (convert: fx to wire graph; artifact: local cache or
    service; load: runtime.load; first_run: first run of each variant). `uncaptured` maps a graph
    that CUDA-graph mode runs plainly to the reason."""

    def __init__(self, settings: BackendSettings) -> None:
        from compiler.signing import TrustedKeys

        self.settings = settings
        self.trusted = TrustedKeys.from_env()  # a bad key file is a configuration error: raised now
        self.cache = LocalCache(settings.cache_dir, self.trusted)
        self.stats: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self.uncaptured: dict[str, str] = {}
        self.capture_groups: dict[torch.device, Any] = {}  # CUDA-graph mode: one shared pool per device
        self._http = None
        self._unreachable: tuple[float, str] | None = None  # (monotonic time, reason)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable:
        from torch._dynamo.backends.common import aot_autograd

        if self.settings.group_linears:
            self._rewrite("grouped_linears", "linears not grouped", group_linears, gm)
        self._rewrite("channels_last_convs", "convolutions left in their layout", use_channels_last, gm,
                      example_inputs, self.settings.channels_last)
        # a new AotAutograd each time: it rewrites its own kwargs when called
        return aot_autograd(fw_compiler=self.compile_graph, bw_compiler=self.compile_backward,
                            **aot_options(self.settings.partitioner))(gm, example_inputs)

    def _rewrite(self, stat: str, failure: str, rewrite: Callable[..., int], gm: torch.fx.GraphModule,
                 *args: Any) -> None:
        """A rewrite of dynamo's graph (client/linear_groups.py, client/channels_last.py), counted in
        `stats[stat]`. A graph it cannot analyse stays as it is (with a warning; raised with
        on_error="raise"): a rewrite is an optimization, never a reason to fail."""
        try:
            self.stats[stat] += rewrite(gm, *args)
        except Exception as exc:
            if self.settings.on_error == "raise":
                raise
            warnings.warn(f"fusewire: {failure}: {type(exc).__name__}: {exc}", FusewireWarning, stacklevel=2)

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                      backward: bool = False) -> "GraphFunction":
        """aot_autograd's forward and inference compiler (and, with `backward`, its backward compiler): a
        boxed callable returning what `gm` returns."""
        self.stats["graphs"] += 1
        name = _graph_name(self.stats["graphs"])
        split = split_at_local_ops(gm)
        if split is not None:  # ops the wire cannot carry run here, between compiled parts
            self.stats["local_ops"] += len(split.local_parts)  # a part each
            return SplitFunction(self, split, name, backward)
        function = GraphFunction(self, gm, name, backward)
        if function.static and function.has_work:
            function.prepare(example_inputs)  # compiled now, at torch.compile time
        return function

    # -- one signature: wire graph -> artifact bytes ------------------------------------

    def compile_backward(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> "GraphFunction":
        """aot_autograd's backward compiler: as compile_graph; the artifact frees saved activations early."""
        return self.compile_graph(gm, example_inputs, backward=True)

    def artifact_for(self, graph, target: str, released_inputs: Sequence[int] = ()) -> bytes:
        """Local cache, else the service (probe, submit, wait, fetch, verify); saved locally.
        `released_inputs`: positions of the inputs the runner drops after their last read
        (CompileOptions.released_inputs)."""
        from compiler.graph import key as graph_key

        options = dict(self.settings.options or {})
        if released_inputs:
            options["released_inputs"] = list(released_inputs)
        key = graph_key(graph, target, options)
        blob = self.cache.get(key)
        if blob is not None:
            self.stats["local_hits"] += 1
            return blob
        blob = self._from_service(graph, key, target, options)
        self.cache.put(key, blob)
        return blob

    def _from_service(self, graph, key: str, target: str, options: dict) -> bytes:
        from client.http import ServiceError

        if self._unreachable and time.monotonic() - self._unreachable[0] < UNREACHABLE_BACKOFF_S:
            raise _Failure(f"{self._unreachable[1]}; not tried again for {UNREACHABLE_BACKOFF_S:g} s")
        client = self._client()
        deadline = time.monotonic() + self.settings.timeout_s
        try:
            if client.exists(key):
                self.stats["remote_hits"] += 1
                return client.fetch_bytes(key)
            submission = client.submit(graph, target, options)
            if submission.key != key:
                raise _Failure(f"the service keyed this graph {submission.key[:12]}, this client {key[:12]}: "
                               "client and service run different fusewire/Triton versions")
            if submission.state == "ready":
                self.stats["remote_hits"] += 1
            else:
                self.stats["compiles"] += 1
                client.wait(key, timeout=max(0.0, deadline - time.monotonic()))
            return client.fetch_bytes(key)
        except ServiceError as exc:
            if exc.status == 0:
                reason = f"service unreachable ({exc.detail})"
                self._unreachable = (time.monotonic(), reason)
                raise _Failure(reason) from None
            where = f" at {exc.where}" if exc.where else ""
            raise _Failure(f"service error {exc.status} {exc.error}: {exc.detail}{where}") from None
        except TimeoutError as exc:
            raise _Failure(f"service compile took longer than timeout_s={self.settings.timeout_s:g}: {exc}") from None

    def _client(self):
        import httpx

        from client.http import FusewireClient

        if self._http is None:
            url = self.settings.url.rstrip("/")
            seconds = max(1.0, min(self.settings.timeout_s, 30.0))  # per request; the compile wait has its own
            timeout = httpx.Timeout(seconds, connect=min(seconds, 5.0))
            # A plain-http URL needs no TLS context, whose certificate loading costs ~50 ms of the first
            # call; redirects are not followed, so verification can never be skipped for an https peer.
            verify = url.startswith("https://")
            self._http = FusewireClient(url, self.settings.token or "", trusted=self.trusted,
                                        http=httpx.Client(base_url=url, timeout=timeout, verify=verify))
        return self._http


class _Failure(RuntimeError):
    """Why a graph falls back; the message is the reason shown to the user."""


def _graph_name(n: int) -> str:
    """aot_autograd's name for the graph being compiled ("model__0_forward_1"), else "graph N"."""
    try:
        from torch._functorch._aot_autograd import logging_utils

        if logging_utils.graph_being_compiled:
            return logging_utils.get_aot_graph_name()
    except (ImportError, AttributeError):  # torch internals moved: a counter names it as well
        pass
    return f"graph {n}"


# -- a compiled aot graph ---------------------------------------------------------------


class GraphFunction:
    """What aot_autograd runs for one fw/bw graph (boxed: called with the list of inputs).

    `variants` maps an input signature to the artifact runner compiled for it; a graph that
    fell back (`eager_reason`) runs `gm` for every signature."""

    def __init__(self, backend: Backend, gm: torch.fx.GraphModule, name: str, backward: bool = False) -> None:
        self._boxed_call = True  # on the instance: dynamo's disable() wrapper copies __dict__, not class attributes
        self.backend, self.gm, self.name, self.backward = backend, gm, name, backward
        self.variants: dict[tuple, _Variant] = {}
        self._last: _Variant | None = None  # the verified variant the previous call ran
        self.eager_reason: str | None = None
        output = gm.graph.find_nodes(op="output")[0]
        self.out_leaves, self.out_spec = pytree.tree_flatten(output.args[0])
        placeholders = gm.graph.find_nodes(op="placeholder")
        self.has_work = any(n.op == "call_function" for n in gm.graph.nodes)
        self.static = all(_is_static_tensor(p.meta.get("val")) for p in placeholders) and all(
            _is_number_leaf(leaf) or _is_static_tensor(leaf.meta.get("val"), missing=True) for leaf in self.out_leaves)

    def __call__(self, args: list) -> Any:
        last = self._last
        if last is not None and last.matches(args):  # the common case: the inputs of the previous call
            return last(args)
        if self.eager_reason is not None or not self.has_work:
            return self.gm(*args)
        signature = _signature(args)
        variant = self.variants.get(signature)
        if variant is None:
            if self.variants:
                self.backend.stats["recompiles"] += 1
            variant = self.prepare(args)
            if variant is None:
                return self.gm(*args)
        if variant.verified:
            self._last = variant.remember(args)
            return variant(args)
        try:  # the first run of an artifact may still fail (a kernel the interpreter rejects...)
            with self._timed("first_run"):
                result = variant(args)
        except Exception as exc:
            self._fall_back(f"its compiled artifact failed on its first run: {type(exc).__name__}: {exc}")
            return self.gm(*args)
        variant.verified = True
        self._last = variant.remember(args)
        return result

    def prepare(self, inputs: Sequence[Any]) -> "_Variant | None":
        """Compiles the variant for these inputs (fake or real); None after a fallback."""
        try:
            variant = self._variant(inputs)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            self._fall_back(_reason(exc))
            return None
        self.variants[_signature(inputs)] = variant
        return variant

    def _variant(self, inputs: Sequence[Any]) -> "_Variant":
        from client.runtime import load
        from compiler.artifact import Artifact
        from compiler.fx_import import from_fx

        with self._timed("convert"):
            if self.static:
                module, tensors, spec, constants = self._strip_outputs(), list(inputs), self.out_spec, self._constants()
            else:
                module, tensors, spec, constants = self._specialise(inputs)
            module, padded = with_an_output(module)
            graph = from_fx(module, tensors)
        released = self._released_inputs(tensors) if self.static else []  # names only a static graph keeps
        with self._timed("artifact"):
            blob = self.backend.artifact_for(graph, _target(tensors), released)
        with self._timed("load"):
            runner = load(Artifact.from_bytes(blob), self.backend.settings.cache_dir, self.backend.trusted)
        if self.backend.settings.cuda_graphs:
            runner = self._graphed(runner, inputs, tensors)
        tensor_positions = [i for i, value in enumerate(inputs) if isinstance(value, torch.Tensor)]
        return _Variant(runner, tensor_positions, spec, constants, drop_last=padded,
                        releases=not self.backend.settings.cuda_graphs)

    def _released_inputs(self, inputs: Sequence[Any]) -> list[int]:
        """Positions of a backward's saved activations that the runner's dropping frees: it drops
        each input after its last read (_Variant.releases), so the compiler's step order may count
        on that memory coming back. Parameters (primals_*) and incoming gradients (tangents_*) stay
        alive with their owners, and an input sharing its storage with another (q, k and v split
        from one projection) frees nothing alone. Nothing is released in CUDA-graph mode."""
        if not self.backward or self.backend.settings.cuda_graphs:
            return []
        from torch.multiprocessing.reductions import StorageWeakRef

        placeholders = self.gm.graph.find_nodes(op="placeholder")
        storages = [StorageWeakRef(t.untyped_storage()) if isinstance(t, torch.Tensor) else None for t in inputs]
        shared = Counter(storages)
        return [i for i, (node, storage) in enumerate(zip(placeholders, storages))
                if storage is not None and shared[storage] == 1 and not node.name.startswith(("primals_", "tangents_"))]

    def _graphed(self, runner: Any, inputs: Sequence[Any], tensors: Sequence[torch.Tensor]) -> Any:
        """CUDA-graph mode: the runner wrapped to capture and replay its launches (CUDA tensors only)."""
        from client.cudagraphs import CaptureGroup, GraphedRunner, mutated_inputs

        if not tensors or any(t.device.type != "cuda" for t in tensors):
            self._uncaptured("its inputs are not all CUDA tensors")
            return runner
        positions = {i: n for n, i in enumerate(i for i, v in enumerate(inputs) if isinstance(v, torch.Tensor))}
        mutated = {positions[i] for i in mutated_inputs(self.gm) if i in positions}
        group = self.backend.capture_groups.setdefault(tensors[0].device, CaptureGroup())
        return GraphedRunner(runner, mutated, self._uncaptured, self._count, group)

    def _uncaptured(self, reason: str) -> None:
        self.backend.uncaptured[self.name] = reason
        self.backend.stats["cuda_graph_fallbacks"] += 1
        log.info("fusewire: %s runs without CUDA graphs: %s", self.name, reason)

    def _count(self, what: str) -> None:
        self.backend.stats[what] += 1

    def _constants(self) -> dict[int, Any]:
        """Output leaves that are not tensors (None, numbers, static numbers an op returns such as
        flash attention's max_q): re-inserted after each run."""
        return {i: leaf.meta["val"] if isinstance(leaf, torch.fx.Node) else leaf
                for i, leaf in enumerate(self.out_leaves) if _is_number_leaf(leaf)}

    def _strip_outputs(self) -> torch.fx.GraphModule:
        """A copy of `gm` whose output holds only its tensor outputs, in order."""
        graph = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        graph.graph_copy(self.gm.graph, env)
        graph.output(tuple(env[leaf] for leaf in self.out_leaves if not _is_number_leaf(leaf)))
        return torch.fx.GraphModule(self.gm, graph)

    def _specialise(self, inputs: Sequence[Any]):
        """Symbolic graph: re-traced on these concrete inputs (sizes and non-tensor inputs become constants)."""
        from torch.fx.experimental.proxy_tensor import make_fx

        if any(_is_symbolic(v) for v in inputs):
            raise _Failure("dynamic-shape graph: it is compiled per concrete signature when called")
        positions = [i for i, value in enumerate(inputs) if isinstance(value, torch.Tensor)]
        seen: dict[str, Any] = {}

        def concrete(*tensors: torch.Tensor) -> list[torch.Tensor]:
            full = list(inputs)
            for i, tensor in zip(positions, tensors):
                full[i] = tensor
            leaves, seen["spec"] = pytree.tree_flatten(self.gm(*full))
            seen["constants"] = {i: v for i, v in enumerate(leaves) if not isinstance(v, torch.Tensor)}
            return [v for v in leaves if isinstance(v, torch.Tensor)]

        tensors = [inputs[i] for i in positions]
        module = make_fx(concrete, tracing_mode="fake")(*tensors)
        constants = seen["constants"]
        if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in constants.values()):
            raise _Failure("graph returns symbolic values that specialisation did not make concrete")
        return module, tensors, seen["spec"], constants

    @contextmanager
    def _timed(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.backend.seconds[phase] += time.perf_counter() - start

    def _fall_back(self, reason: str) -> None:
        self.backend.stats["fallbacks"] += 1
        self._last = None
        if self.backend.settings.on_error == "raise":
            raise FusewireError(f"fusewire: {self.name}: {reason}")
        self.eager_reason = reason
        warnings.warn(f"fusewire: {self.name} runs eagerly: {reason}", FusewireWarning, stacklevel=2)


def with_an_output(module: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, bool]:
    """A graph whose only effect is writing into its inputs (an optimizer step, a BatchNorm running
    statistics update kept in the graph) returns nothing, and the wire format needs an output: such a
    graph also returns its first input, which the caller drops (True)."""
    output = module.graph.find_nodes(op="output")[0]
    placeholders = module.graph.find_nodes(op="placeholder")
    if pytree.tree_leaves(output.args[0]) or not placeholders:
        return module, False
    output.args = ((placeholders[0],),)
    module.recompile()
    return module, True


def _tensor_guard(args: list) -> Any:
    """A C++ check that tensors have exactly these tensors' sizes, strides, dtypes, devices and
    dispatch keys; None if this torch has no such check."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(*args, dynamic_dims_sizes=[list(t.shape) for t in args],
                            dynamic_dims_strides=[list(t.stride()) for t in args])
    except (ImportError, TypeError, RuntimeError):
        return None


@dataclass
class _Variant:
    """One compiled signature: runs the artifact, puts the outputs back in the graph's structure."""

    runner: Any  # client.runtime.CompiledGraph
    tensor_positions: list[int]
    out_spec: Any
    constants: dict[int, Any]
    verified: bool = False
    # the exact (shape, stride, dtype, device) of each argument of a call it ran: `matches` compares
    # a new call's arguments with these, one cheap check per call; None for graphs with non-tensor inputs
    _seen: list[tuple] | None = None
    # the same check in C++ (dynamo's TensorGuards: also dispatch keys and requires_grad), 6x faster for
    # the 100+ arguments of a training graph; None where this torch lacks it
    _guard: Any = None
    drop_last: bool = False  # the artifact returns one tensor more than the graph (_with_an_output)
    # a verified run empties the caller's argument list and the runner drops each input after its last
    # use (a backward's saved activations are freed as it goes); not the CUDA-graph runner
    releases: bool = False

    def remember(self, args: list) -> "_Variant":
        if len(self.tensor_positions) == len(args):
            self._seen = [(t.shape, t.stride(), t.dtype, t.device) for t in args]
            self._guard = _tensor_guard(args)
        return self

    def matches(self, args: list) -> bool:
        seen = self._seen
        if seen is None or len(args) != len(seen):
            return False
        if self._guard is not None:
            return self._guard.check(*args)
        for tensor, (shape, stride, dtype, device) in zip(args, seen):
            if (not isinstance(tensor, torch.Tensor) or tensor.shape != shape or tensor.dtype != dtype
                    or tensor.device != device or tensor.stride() != stride):
                return False
        return True

    def __call__(self, args: list) -> Any:
        tensors = [args[i] for i in self.tensor_positions]
        if self.verified and self.releases:  # boxed call: the caller's list is ours (aot_autograd steals it)
            args.clear()
            results = self.runner.run_checked(tensors, release=True)
        else:
            results = self.runner.run_checked(tensors)
        if self.drop_last:
            results.pop()
        if not self.constants:
            if self.out_spec.type in (list, tuple) and self.out_spec.num_leaves == self.out_spec.num_children:
                return self.out_spec.type(results)  # aot_autograd's flat list or tuple: no pytree walk
            return pytree.tree_unflatten(results, self.out_spec)
        results = iter(results)
        leaves = [self.constants[i] if i in self.constants else next(results) for i in range(self.out_spec.num_leaves)]
        return pytree.tree_unflatten(leaves, self.out_spec)


def _reason(exc: Exception) -> str:
    from client.http import ArtifactVerificationError, CompileFailed
    from compiler.fx_import import ConversionError
    from compiler.signing import SignatureError

    if isinstance(exc, _Failure):
        return str(exc)
    if isinstance(exc, ConversionError):
        return f"it cannot be expressed in the wire format: {exc}"
    if isinstance(exc, CompileFailed):
        return f"the service's compile failed: {exc.job.get('error')}"
    if isinstance(exc, (ArtifactVerificationError, SignatureError)):
        return f"the artifact failed verification: {exc}"
    return f"{type(exc).__name__}: {exc}"


# -- signatures, targets ----------------------------------------------------------------


def _is_static_tensor(value: Any, missing: bool = False) -> bool:
    if value is None:
        return missing
    return isinstance(value, torch.Tensor) and not any(
        isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride()))


def _is_number_leaf(leaf: Any) -> bool:
    """An output leaf that is no tensor: a literal, or a node whose value is a plain (static) number."""
    if not isinstance(leaf, torch.fx.Node):
        return True
    value = leaf.meta.get("val")
    return isinstance(value, (bool, int, float)) and not isinstance(value, torch.Tensor)


def _is_symbolic(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not _is_static_tensor(value)
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _signature(inputs: Sequence[Any]) -> tuple:
    """What a compiled variant depends on; strides of size-1 dims never matter (as in the runtime)."""
    parts = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            shape = tuple(value.shape)
            stride = tuple(0 if size == 1 else step for size, step in zip(shape, value.stride()))
            parts.append((shape, stride, value.dtype, value.device))
        else:
            parts.append((type(value).__name__, value))
    return tuple(parts)


def _target(tensors: Sequence[torch.Tensor]) -> str:
    """'cuda:sm_XY' of the first CUDA input's device, else 'cpu'."""
    for tensor in tensors:
        if tensor.device.type == "cuda":
            return cuda_target(tensor.device)
    return "cpu"


# -- the local artifact cache -------------------------------------------------------------


class LocalCache:
    """`<root>/artifacts/<key>.fwa` (the bundle, as served) and `<key>.fwa.sha256` (its digest).

    Written atomically (temp file + rename, digest first, bundle last); read back only when the
    digest matches, the manifest names the key and the signature checks against `trusted`. A bad
    entry is removed and counts as a miss."""

    def __init__(self, root: Path, trusted=None) -> None:
        """`trusted`: compiler.signing.TrustedKeys; None = those of the environment."""
        from compiler.signing import TrustedKeys

        self.dir = Path(root) / "artifacts"
        self.trusted = trusted if trusted is not None else TrustedKeys.from_env()

    def path(self, key: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"not an artifact key: {key!r}")
        return self.dir / f"{key}.fwa"

    def get(self, key: str) -> bytes | None:
        from compiler.artifact import Artifact, ArtifactError, digest_of
        from compiler.signing import SignatureError, verify_artifact

        path = self.path(key)
        try:
            blob = path.read_bytes()
            digest = path.with_suffix(".fwa.sha256").read_text().strip()
        except OSError:
            return None
        problem = None
        if digest_of(blob) != digest:
            problem = "its sha256 does not match"
        else:
            try:
                artifact = Artifact.from_bytes(blob)
                if artifact.manifest.get("key") != key:
                    problem = "its manifest names another key"
                else:
                    verify_artifact(artifact, self.trusted)
            except (ArtifactError, SignatureError) as exc:
                problem = str(exc)
        if problem:
            log.warning("fusewire: removing bad local cache entry %s: %s", path, problem)
            for stale in (path, path.with_suffix(".fwa.sha256")):
                stale.unlink(missing_ok=True)
            return None
        return blob

    def put(self, key: str, blob: bytes) -> None:
        from compiler.artifact import digest_of

        path = self.path(key)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            _write_atomic(path.with_suffix(".fwa.sha256"), digest_of(blob).encode())
            _write_atomic(path, blob)
        except OSError as exc:  # a read-only or full disk costs the next process a fetch, nothing more
            log.warning("fusewire: cannot write the local cache %s: %s", self.dir, exc)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
