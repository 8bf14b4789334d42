"""Cubins for a CUDA target are built on this CPU-only machine and are well-formed."""

from __future__ import annotations

from dataclasses import replace

import pytest

import compiler
from compiler.artifact import Artifact
from compiler.codegen.aot import AotError, build_cubins, build_pool
from tests.corpus import load_graph


@pytest.fixture(scope="module")
def sm90_artifact() -> Artifact:
    return Artifact.from_bytes(compiler.compile(load_graph("bias_residual_layer_norm_bf16"), "cuda:sm_90").to_bytes())


def test_every_kernel_carries_an_sm90_cubin(sm90_artifact):
    kernels = sm90_artifact.manifest["kernels"]
    assert kernels
    for kernel in kernels:
        cubin = sm90_artifact.files[kernel["cubin"]]
        assert cubin[:4] == b"\x7fELF"  # a CUDA binary is an ELF file
        assert len(cubin) > 1000
        built = kernel["cubin_metadata"]
        assert built["metadata"]["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
        assert built["metadata"]["name"] == kernel["name"]
        assert built["metadata"]["num_warps"] == kernel["config"]["num_warps"]
        assert set(built["constants"]) == {"xnumel", "rnumel", "XBLOCK", "RBLOCK"}
        pointers = [a for a in built["arg_names"] if a.startswith("ptr_")]
        assert all(built["signature"][p].startswith("*") for p in pointers)


def test_cpu_target_has_no_cubins():
    artifact = compiler.compile(load_graph("softmax_fp32"), "cpu")
    assert all("cubin" not in k for k in artifact.manifest["kernels"])
    assert not any(name.startswith("cubins/") for name in artifact.files)


def test_cuda_key_differs_from_cpu_key(sm90_artifact):
    cpu = compiler.compile(load_graph("bias_residual_layer_norm_bf16"), "cpu")
    assert cpu.key != sm90_artifact.key


def _softmax_kernels():
    from compiler.codegen import generate_kernel
    from compiler.lowering import lower
    from compiler.options import CompileOptions
    from compiler.scheduler import KernelGroup, schedule

    program = lower(load_graph("softmax_fp32"))
    scheduled = schedule(program, CompileOptions())
    dtypes = program.buffer_dtypes()
    group = next(s for s in scheduled.steps if isinstance(s, KernelGroup))
    return generate_kernel(group, scheduled, dtypes, "cuda:sm_90"), dtypes


def test_a_batch_builds_each_kernel_with_its_own_config():
    kernel, dtypes = _softmax_kernels()
    warps = [1, 2, 4, 8, 16]
    trials = [replace(kernel, config=kernel.config | {"num_warps": w}) for w in warps]
    build_cubins(trials, dtypes, "cuda:sm_90")
    assert [t.cubin_metadata["metadata"]["num_warps"] for t in trials] == warps
    assert len({t.cubin for t in trials}) == len(warps)


def test_a_kernel_triton_rejects_is_named_and_the_pool_still_builds():
    kernel, dtypes = _softmax_kernels()
    broken = replace(kernel, source=kernel.source.replace("tl.arange(0, RBLOCK)", "tl.arange(0, RBLOCK + 1)", 1))
    with pytest.raises(AotError, match=f"building {kernel.name} failed"):
        build_cubins([broken], dtypes, "cuda:sm_90")
    healthy = replace(kernel)
    build_cubins([healthy], dtypes, "cuda:sm_90")
    assert healthy.cubin[:4] == b"\x7fELF"


def test_a_build_server_that_died_is_replaced():
    kernel, dtypes = _softmax_kernels()
    build_cubins([replace(kernel)], dtypes, "cuda:sm_90")  # at least one idle server now
    pool = build_pool()
    idle = []
    while not pool._idle.empty():
        idle.append(pool._idle.get_nowait())
    for server in idle:
        server.process.kill()
        server.process.wait()
        pool._idle.put(server)
    with pytest.raises(AotError, match="build process exited"):
        build_cubins([replace(kernel)], dtypes, "cuda:sm_90")  # a dead server's one failure, then it is retired
    for _ in range(len(idle)):
        rebuilt = replace(kernel, config=kernel.config | {"num_warps": 2})
        try:
            build_cubins([rebuilt], dtypes, "cuda:sm_90")
        except AotError:
            continue  # another of the killed servers was taken first
        break
    assert rebuilt.cubin[:4] == b"\x7fELF"


def test_warming_a_pool_starts_every_build_server_ahead_of_the_first_build():
    import time

    from compiler.codegen.aot import BuildPool

    pool = BuildPool(2)
    try:
        pool.warm()
        deadline = time.monotonic() + 60
        while pool._idle.qsize() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        servers = [pool._idle.get_nowait() for _ in range(2)]
        assert all(server.process.poll() is None for server in servers)  # alive, waiting for work
        assert pool._started == 2
        for server in servers:
            pool._idle.put(server)
    finally:
        pool.close()
