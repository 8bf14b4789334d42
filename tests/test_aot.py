"""Cubins for a CUDA target are built on this CPU-only machine and are well-formed."""

from __future__ import annotations

import pytest

import compiler
from compiler.artifact import Artifact
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
