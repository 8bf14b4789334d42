"""Line order inside generated kernels: loads first, as far as their operands and earlier stores
to the same buffer allow (compiler.codegen.group._loads_first)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from compiler.codegen.group import _loads_first
from compiler.codegen.kernel import LoadLine, Section, StoreLine
from tests.test_scheduler import compile_and_check


def _writer(persistent: bool, *sections: list) -> SimpleNamespace:
    built = []
    for i, lines in enumerate(sections):
        section = Section("r" if i % 2 else "x", "[XBLOCK, RBLOCK]", "rxmask")
        section.lines.extend(lines)
        built.append(section)
    return SimpleNamespace(persistent=persistent, is_reduction=True, sections=built)


def _load(var: str, buffer: str, index: str = "xindex") -> LoadLine:
    return LoadLine(buffer, f"{var} = tl.load(ptr_{buffer} + {index}, xmask, other=0", False)


def _text(line) -> str:
    return line if isinstance(line, str) else line.text


def test_loads_rise_above_math_and_stores_of_other_buffers_keeping_their_order():
    writer = _writer(True, [
        _load("tmp1", "a"),
        "tmp2 = tmp1 * tmp1",
        StoreLine("out", "tl.store(ptr_out + xindex, tmp2, xmask)"),
        _load("tmp3", "b"),
        _load("tmp4", "c"),
        "tmp5 = tmp3 + tmp4",
    ])
    lines = [_text(line) for line in _loads_first(writer)[0]]
    assert [line.split(" =")[0] for line in lines[:3]] == ["tmp1", "tmp3", "tmp4"]
    assert lines[3:] == ["tmp2 = tmp1 * tmp1", "tl.store(ptr_out + xindex, tmp2, xmask)", "tmp5 = tmp3 + tmp4"]


def test_a_load_stays_behind_a_store_to_its_buffer_and_behind_the_index_it_uses():
    writer = _writer(True, [
        _load("tmp1", "a"),
        StoreLine("stat", "tl.store(ptr_stat + xindex, tmp1, xmask)"),
        "tmp2 = tl.where(tmp1 < 0, tmp1 + 7, tmp1)",
        _load("tmp3", "stat"),            # reads what the store above wrote
        _load("tmp4", "table", "tmp2"),   # an indirect load: its index is computed
    ])
    lines = [_text(line) for line in _loads_first(writer)[0]]
    assert lines.index("tl.store(ptr_stat + xindex, tmp1, xmask)") < next(i for i, t in enumerate(lines) if t.startswith("tmp3"))
    assert lines.index("tmp2 = tl.where(tmp1 < 0, tmp1 + 7, tmp1)") < next(i for i, t in enumerate(lines) if t.startswith("tmp4"))


def test_straight_line_kernels_move_loads_across_sections_loops_do_not():
    sections = ([_load("tmp1", "a"), StoreLine("m", "tl.store(ptr_m + xindex, tmp1, xmask)")],
                ["tmp2 = tmp1 + 1", _load("tmp3", "w", "rindex")])
    persistent = _loads_first(_writer(True, *sections))
    assert [_text(line).split(" =")[0] for line in persistent[0][:2]] == ["tmp1", "tmp3"]
    looped = _loads_first(_writer(False, *sections))
    assert [_text(line) for line in looped[1]] == ["tmp3 = tl.load(ptr_w + rindex, xmask, other=0", "tmp2 = tmp1 + 1"]
    assert len(looped[0]) == 2


def test_gelu_layer_norm_kernel_loads_everything_before_its_first_store():
    """GELU feeding a LayerNorm whose weight and bias are read after the GELU output is stored:
    in the generated kernel every load comes first, and the results still match eager."""
    def fn(x, w, b):
        h = F.gelu(x)
        return h, F.layer_norm(h, (37,), w, b)

    x, w, b = torch.randn(6, 37), torch.randn(37), torch.randn(37)
    artifact = compile_and_check(fn, x, w, b)
    (kernel,) = artifact.manifest["kernels"]
    source = artifact.kernel_source(kernel)
    loads = [m.start() for m in re.finditer(r"tl\.load\(", source)]
    stores = [m.start() for m in re.finditer(r"tl\.store\(", source)]
    assert len(loads) == 3 and stores
    assert max(loads) < min(stores)


def test_a_large_row_read_again_by_a_later_loop_stays_in_l2_a_small_one_is_left_alone():
    from compiler.codegen.group import RELOAD_KEEP_MIN_BYTES, eviction_policy
    from compiler.indexing import RINDEX, XINDEX

    def policy(rows: int, persistent: bool = False, kind: str = "r", reloaded=("x",)) -> str | None:
        writer = SimpleNamespace(is_reduction=True, tiled=False, persistent=persistent, reread_later=frozenset(),
                                 bounds={XINDEX: rows, RINDEX: 32000}, buffer_dtypes={"x": "bfloat16"})
        return eviction_policy(writer, kind, _load("tmp1", "x", "rindex + 32000*xindex"), set(reloaded))

    large = RELOAD_KEEP_MIN_BYTES // (32000 * 2) + 1
    assert policy(large) == "evict_last"      # the first loop of a log-softmax over 4096 x 32000
    assert policy(large, reloaded=()) == "evict_first"  # the last loop to read it streams it
    assert policy(16) is None                 # 1 MB: stays in L2 without being told
    assert policy(large, persistent=True) is None


def test_a_pointwise_kernel_keeps_in_l2_what_it_reads_more_than_once():
    """Token ids (one per 48 features) and a position table (one row per position, every sequence
    of the batch) are read more than once: evict_last, as Inductor marks them. The gathered
    embedding rows and the concatenated halves (offset loads under a mask) span as many elements
    as the kernel: no hint."""
    def fn(ids, table, positions, a, b):
        return F.embedding(ids, table) + positions, torch.cat([a, b], dim=-1) * 2

    ids = torch.randint(0, 50, (3, 7))
    table, positions = torch.randn(50, 48), torch.randn(7, 48)
    a, b = torch.randn(5, 6, 3), torch.randn(5, 6, 5)
    artifact = compile_and_check(fn, ids, table, positions, a, b)
    loads = [line.strip() for k in artifact.manifest["kernels"] for line in artifact.kernel_source(k).splitlines()
             if "tl.load(" in line]
    kept = [line for line in loads if "evict_last" in line]
    assert len(loads) == 5 and len(kept) == 2, loads
    assert not any("tmp" in line.split("tl.load(")[1].split(",")[0] for line in kept), kept  # not the gather


def test_an_index_that_leaves_out_some_of_xindex_digits_reads_its_elements_again():
    from compiler.codegen.kernel import skips_digits
    from compiler.indexing import XINDEX, FloorDiv, ModularIndexing, index_symbol

    x = XINDEX
    assert skips_digits(FloorDiv(x, 768), 8192 * 768)                     # a token's id, once per feature
    assert skips_digits(ModularIndexing(x, 1, 786432), 8 * 786432)        # positions, once per sequence
    assert skips_digits(ModularIndexing(x, 1, 64) + 64 * ModularIndexing(x, 1024, 1024), 1 << 22)  # rotary tables
    assert not skips_digits(ModularIndexing(x, 1, 8) + 3 * FloorDiv(x, 8), 240)  # a cat's input: every digit
    assert not skips_digits(2 * x + 1, 1000)                                # xindex whole
    assert not skips_digits(ModularIndexing(x, 1, 768) + 768 * index_symbol("tmp", 2), 1 << 20)  # a gather
