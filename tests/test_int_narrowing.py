"""Index arithmetic compared in int32 (KernelWriter.narrow_int): ATen computes positions in int64
(a max-pool backward's window bounds, an arange's masks), the kernel computes indices in int32
when every buffer fits, and a comparison of such values with small constants needs no 64-bit
compare, which takes several instructions where int32 takes one (the pool backward's kernel:
1290 PTX instructions for 8 elements a thread, 742 narrowed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler.fx_import import from_fx
from tests.lowering_cases import kernel_sources
from tests.test_scheduler import compile_and_check


def test_pool_backward_window_bounds_compare_in_int32():
    x = torch.randn(2, 3, 13, 11)
    out, indices = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    grad = torch.randn_like(out)

    def backward(grad, x, indices):
        return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [3, 3], [2, 2], [1, 1], [1, 1], False, indices)

    source = kernel_sources(compile_and_check(backward, grad, x, indices))
    compared = re.findall(r"= (tmp\d+) ([<>]=?|==|!=) (-?\d+)$", source, re.M)
    assert compared, "window bounds are compared with literals"
    int64_constants = set(re.findall(r"(tmp\d+) = tl\.full\(\[XBLOCK\], -?\d+, tl\.int64\)", source))
    assert not any(re.search(rf"[<>=!]=? {name}\b", source) for name in int64_constants)
    # the saved positions are int64 tensors: comparing them with the window's position stays int64
    assert ".to(tl.int64)" in source


def test_a_constant_beyond_int32_keeps_the_int64_compare():
    x = torch.randn(37)
    source = kernel_sources(compile_and_check(lambda x: torch.where(torch.arange(37) * 4 < 2**33, x, -x), x))
    assert "8589934592" in source


def test_negative_positions_compare_correctly():
    """An index expression that goes negative (the window before the first one) stays signed."""
    x = torch.randn(3, 29)
    compile_and_check(lambda x: torch.where(torch.arange(29) - 7 >= -3, x, 0.0), x)


def test_small_integers_widened_to_int64_compute_in_int32(monkeypatch):
    """With NARROW_WIDENED on, a max-pool's saved int8 window offsets decoded to flat int64
    positions, negative offsets included (Python's floor division and remainder signs): no int64
    division is left."""
    import compiler.codegen.int_narrowing as int_narrowing

    monkeypatch.setattr(int_narrowing, "NARROW_WIDENED", True)
    offsets = torch.randint(-128, 128, (5, 7, 9), dtype=torch.int8)

    def decode(offsets):
        wide = offsets.to(torch.int64)
        return (wide // 3 - 1) * 112 + torch.remainder(wide, 3) + torch.arange(9) * 2

    source = kernel_sources(compile_and_check(decode, offsets))
    assert "// 3" in source and "tl.abs(tmp" in source
    assert not re.search(r"// tl\.abs", source)


def _decode(offsets):
    wide = offsets.to(torch.int64)
    return (wide // 3 - 1) * 112 + torch.remainder(wide, 3) + torch.arange(offsets.shape[-1]) * 2


def test_the_decode_is_correct_with_widened_values_left_in_int64(monkeypatch):
    """NARROW_WIDENED off (shipped, Inductor's form): the same results in int64 arithmetic."""
    import compiler.codegen.int_narrowing as int_narrowing

    monkeypatch.setattr(int_narrowing, "NARROW_WIDENED", False)
    offsets = torch.randint(-128, 128, (5, 7, 9), dtype=torch.int8)
    source = kernel_sources(compile_and_check(_decode, offsets))
    assert "// tl.abs" in source  # an int64 division, as the switch asks


def test_an_int8_decode_in_int64_converts_its_int8_input_between_layouts(tmp_path, monkeypatch):
    """The int8 load and the int64 store want different register layouts. Computed in int64, the
    kernel converts its int8 input, as Inductor's does, only if its floor division casts no bool
    to an integer (a second widening would keep Triton from moving the conversion up to the load).
    Compiled for sm_90 on a CPU; the TTGIR says where the conversion is."""
    import compiler.codegen.int_narrowing as int_narrowing
    from compiler.codegen import generate
    from compiler.codegen.aot import _job_entry
    from compiler.fx_import import from_fx
    from compiler.lowering import lower
    from compiler.options import CompileOptions
    from compiler.scheduler import schedule
    from torch.fx.experimental.proxy_tensor import make_fx

    offsets = torch.randint(-128, 128, (32, 64, 56, 56), dtype=torch.int8)
    program = lower(from_fx(make_fx(_decode)(offsets), [offsets]))

    def converted_types(narrow: bool) -> list[str]:
        monkeypatch.setattr(int_narrowing, "NARROW_WIDENED", narrow)
        (kernel,) = generate(schedule(program, CompileOptions()), "cuda:sm_90").kernels
        entry = _job_entry(kernel, program.buffer_dtypes(), tmp_path, f"decode_{narrow}")
        return re.findall(r"convert_layout %\S+ : tensor<\d+x(\w+),", _ttgir(entry | {"arch": 90}))

    assert converted_types(narrow=False) == ["i8"]  # the shipped form, 2 % faster on an H100
    assert converted_types(narrow=True) == ["i32"]


def _ttgir(entry: dict) -> str:
    """The TTGIR of one kernel entry compiled for its arch in a fresh Python process, as the cubin
    build servers compile (compiler/codegen/aot_server.py): a test process that has run kernels under
    Triton's interpreter may hold interpreter state that Triton's compiler trips on."""
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); from aot_server import compile_kernel; "
              "print(compile_kernel(json.loads(sys.stdin.read()))[0].asm['ttgir'])")
    server_dir = Path(__file__).resolve().parents[1] / "compiler" / "codegen"
    run = subprocess.run([sys.executable, "-c", script, str(server_dir)], input=json.dumps(entry), text=True,
                         capture_output=True, env=dict(os.environ, TRITON_INTERPRET="0"), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def _sm90_sources(fn, *inputs) -> str:
    """The kernels' sources for an H100 (nothing run), heuristic configs."""
    graph = from_fx(make_fx(fn)(*inputs), list(inputs))
    return kernel_sources(compiler.compile(graph, "cuda:sm_90", {"autotune": False, "benchmark_fusion": False}))


def _reflection_pad(x):
    return F.pad(x, (2, 1, 1, 3), mode="reflect") * 2


WRAP = re.compile(r"tl\.where\((tmp\d+) < 0, \1 \+ \d+, \1\)")


def test_reflection_pad_indices_compute_in_int32_without_wrapping(monkeypatch):
    """PyTorch's decomposition reflects with |x| in int64 and reads through an index that PyTorch
    would wrap were it negative; its interval shows it never is, so it is used as computed, in int32."""
    import compiler.codegen.int_narrowing as int_narrowing

    x = torch.randn(2, 3, 9, 7).to(memory_format=torch.channels_last)
    compile_and_check(_reflection_pad, x)
    source = _sm90_sources(_reflection_pad, x)
    assert not WRAP.search(source)
    widened = set(re.findall(r"(tmp\d+) = .*\.to\(tl\.int64\)$", source, re.M))
    absolute = re.findall(r"tl\.abs\((tmp\d+)\)", source)
    assert absolute and not widened & set(absolute)  # |x| of int32 values only
    monkeypatch.setattr(int_narrowing, "NARROW_ABS", False)
    assert WRAP.search(_sm90_sources(_reflection_pad, x))
    compile_and_check(_reflection_pad, x)


def test_an_index_that_may_be_negative_still_wraps():
    """x[arange(7) - 3]: PyTorch counts -3..-1 from the end."""
    x = torch.randn(11, 5)
    fn = lambda x: x[torch.arange(7) - 3] + 1  # noqa: E731
    compile_and_check(fn, x)
    assert WRAP.search(_sm90_sources(fn, x))
