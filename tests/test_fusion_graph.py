"""The scheduler's data structures for large graphs, checked against brute force on random
graphs: StepGraph (cycle checks, merges, pairs worth trying), the ranked candidate arrays,
and the vectorized index evaluation behind same_index and tiling."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import sympy

from compiler.fusion_candidates import Candidates, live_pairs, set_bits
from compiler.fusion_graph import StepGraph
from compiler.index_points import evaluate
from compiler.indexing import FloorDiv, ModularIndexing, index_symbol


def random_dag(rng: random.Random, count: int, density: float) -> list[tuple[int, int]]:
    return [(a, b) for a in range(count) for b in range(a + 1, count) if rng.random() < density]


def closure(succ: dict) -> dict:
    """Every node's descendants (brute force)."""
    reach: dict = {}

    def visit(node):
        if node not in reach:
            reach[node] = set()
            for s in succ[node]:
                reach[node] |= {s} | visit(s)
        return reach[node]

    for node in succ:
        visit(node)
    return reach


def via_third(succ: dict, a, b) -> bool:
    """A path of two or more edges between a and b, either way (brute force)."""
    reach = closure(succ)
    return any(b in reach[s] for s in succ[a] if s != b) or any(a in reach[s] for s in succ[b] if s != a)


def contract(succ: dict, a, b, merged) -> dict:
    out = {}
    for node, after in succ.items():
        if node in (a, b):
            continue
        out[node] = {merged if s in (a, b) else s for s in after}
    out[merged] = {s for s in succ[a] | succ[b] if s not in (a, b)}
    return out


def assert_ranks_topological(graph: StepGraph) -> None:
    assert len(set(graph.rank.values())) == len(graph.rank)
    for node, after in graph.succ.items():
        for s in after:
            assert graph.rank[node] < graph.rank[s]
            assert node in graph.pred[s]


@pytest.mark.parametrize("seed", range(8))
def test_merges_keep_ranks_topological_and_cycle_checks_exact(seed):
    rng = random.Random(seed)
    count = 40
    edges = random_dag(rng, count, 0.08)
    order = {k: rng.random() for k in range(count)}  # ties of the initial ranks broken anyhow
    graph = StepGraph(range(count), edges, order)
    succ = {k: {b for a, b in edges if a == k} for k in range(count)}
    assert_ranks_topological(graph)
    next_key = count
    for _ in range(200):
        a, b = rng.sample(sorted(graph.succ, key=str), 2)
        cycle = graph.creates_cycle(a, b)
        assert cycle == via_third(succ, a, b)
        if not cycle:
            graph.merge(a, b, next_key)
            succ = contract(succ, a, b, next_key)
            next_key += 1
            assert {k: set(v) for k, v in graph.succ.items()} == succ
            assert_ranks_topological(graph)
        if len(graph) < 3:
            break


@pytest.mark.parametrize("seed", range(8))
def test_separable_partners_drop_exactly_the_pairs_with_a_user_between(seed):
    rng = random.Random(100 + seed)
    count = 60
    edges = random_dag(rng, count, 0.05)
    graph = StepGraph(range(count), edges, {k: k for k in range(count)})
    succ = {k: {b for a, b in edges if a == k} for k in range(count)}
    reach = closure(succ)
    users = sorted(rng.sample(range(count), 20), key=lambda _: rng.random())
    masks = graph.separable_partners(users)
    for i, j in itertools.combinations(range(len(users)), 2):
        u, w = users[i], users[j]
        between = any((k not in (u, w)) and ((k in reach[u] and w in reach[k]) or (k in reach[w] and u in reach[k]))
                      for k in users)
        assert bool(masks[i] >> j & 1) == (not between), (u, w)
        if between:  # and so merging them would close a cycle
            assert graph.creates_cycle(u, w)
    assert all(mask < (1 << len(users)) and mask & ((1 << (i + 1)) - 1) == 0 for i, mask in enumerate(masks))


def test_span_counts_the_nodes_ranked_between():
    graph = StepGraph(range(6), [(0, 1), (1, 2), (3, 4)], {k: k for k in range(6)})
    assert graph.span([0, 2]) == 3
    assert graph.span([5]) == 1


def _random_steps(rng: random.Random, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.array(sorted(rng.sample(range(40 * count), count)), dtype=np.int64)
    last = order + np.array([rng.choice([0, 0, 3, 40, 400]) for _ in range(count)], dtype=np.int64)
    return order, last, np.array([rng.random() < 0.2 for _ in range(count)])


def test_candidates_rank_like_a_python_sort():
    rng = random.Random(7)
    order, last, extern = _random_steps(rng, 30)
    candidates = Candidates(order, last, extern)
    expected: dict[tuple[int, int], list] = {}  # pair -> [saved], in the order first found
    for index in range(12):  # buffers
        users = np.array(sorted(rng.sample(range(30), rng.randrange(2, 9))), dtype=np.int64)
        accessed = np.array([rng.random() < 0.8 for _ in users])
        nbytes = rng.choice([4, 8, 1024])
        i, j = np.triu_indices(len(users), 1)
        candidates.add(index, users, (i, j), accessed, nbytes)
        for a, b in zip(i.tolist(), j.tolist()):
            first, second = int(users[a]), int(users[b])
            if extern[first] and extern[second]:
                continue
            entry = expected.setdefault((first, second), [0])
            entry[0] += nbytes if accessed[a] and accessed[b] else 0
    # what the scheduler did before: a stable sort, best first, of the pairs in the order found
    ranked = sorted(expected, key=lambda p: (expected[p][0], -abs(int(order[p[1]]) - int(last[p[0]]))), reverse=True)
    assert list(candidates.live_pairs(np.zeros(30, dtype=bool))) == ranked


@pytest.mark.parametrize("seed", range(6))
def test_far_pairs_of_hubs_come_up_exactly_where_listing_them_all_puts_them(seed):
    """Hub pairs listed late (only those still alive) give the same pairs in the same order as
    all pairs listed at once, whatever the caller fuses meanwhile."""
    rng = random.Random(seed)
    count = 80
    order, last, extern = _random_steps(rng, count)
    buffers = []
    for index in range(10):
        users = np.array(sorted(rng.sample(range(count), rng.randrange(2, 40 if index % 3 == 0 else 6))), dtype=np.int64)
        masks = [sum(1 << j for j in range(i + 1, len(users)) if rng.random() < 0.6) for i in range(len(users))]
        buffers.append((index, users, masks, np.array([rng.random() < 0.8 for _ in users]), rng.choice([8, 8, 64])))

    def run(lazy: bool) -> list:
        candidates = Candidates(order, last, extern)
        for index, users, masks, accessed, nbytes in buffers:
            if lazy and len(users) > 10:
                candidates.add_hub(index, users, masks, accessed, nbytes)
            else:
                pairs = [(i, j) for i, mask in enumerate(masks) for j in set_bits(mask, len(users)).tolist()]
                candidates.add(index, users, (np.array([p[0] for p in pairs], dtype=np.int64),
                                              np.array([p[1] for p in pairs], dtype=np.int64)), accessed, nbytes)
        dead = np.zeros(count, dtype=bool)
        seen = []
        for a, b in candidates.live_pairs(dead, chunk=7):
            seen.append((a, b))
            if (a * 31 + b * 17 + seed) % 3 == 0:  # the caller fuses some pairs
                dead[a] = dead[b] = True
        return seen

    assert run(lazy=True) == run(lazy=False)


def test_live_pairs_skip_steps_marked_dead_meanwhile():
    first = np.array([0, 1, 2, 0, 3, 4], dtype=np.int64)
    second = np.array([1, 2, 3, 2, 4, 5], dtype=np.int64)
    dead = np.zeros(6, dtype=bool)
    seen = []
    for a, b in live_pairs(first, second, dead, chunk=2):
        seen.append((a, b))
        if (a, b) in ((0, 1), (3, 4)):
            dead[a] = dead[b] = True
    assert seen == [(0, 1), (2, 3), (3, 4)]


def test_set_bits():
    assert set_bits(0, 5).tolist() == []
    assert set_bits(0b1010_0000_0001, 12).tolist() == [0, 9, 11]


def _random_index(rng: random.Random, symbols: list) -> sympy.Expr:
    terms = [rng.choice([1, 2, 3, 7, -1]) * rng.choice(symbols) for _ in range(rng.randrange(1, 4))]
    expr = sympy.Add(*terms) + rng.randrange(-3, 5)
    for _ in range(rng.randrange(0, 3)):
        kind = rng.random()
        if kind < 0.4:
            expr = FloorDiv(expr, rng.choice([2, 3, 4, 16]))
        elif kind < 0.8:
            expr = ModularIndexing(expr, rng.choice([1, 2, 5]), rng.choice([3, 4, 8]))
        else:
            expr = expr * rng.choice([2, 3]) + rng.choice(symbols)
    return expr


def test_index_points_agree_with_sympy():
    rng = random.Random(3)
    symbols = [index_symbol("x", 0), index_symbol("x", 1), index_symbol("r", 0)]
    bounds = {s: rng.randrange(2, 40) for s in symbols}
    for _ in range(300):
        expr = _random_index(rng, symbols)
        points = [[rng.randrange(bounds[s]) for s in symbols] for _ in range(25)]
        columns = {s: np.array([p[i] for p in points], dtype=np.int64) for i, s in enumerate(symbols)}
        got = evaluate(expr, columns, bounds)
        want = [int(expr.xreplace(dict(zip(symbols, map(sympy.Integer, p))))) for p in points]
        assert got is not None and got.tolist() == want, expr


def test_index_points_decline_what_they_cannot_do_exactly():
    x = index_symbol("x", 0)
    columns, bounds = {x: np.arange(4, dtype=np.int64)}, {x: 4}
    assert evaluate(x / 2, columns, bounds) is None  # a rational coefficient
    assert evaluate(sympy.Max(x, 2), columns, bounds) is None
    assert evaluate(x * 2**62, columns, bounds) is None  # could overflow int64
    assert evaluate(sympy.Integer(5), columns, bounds).tolist() == [5, 5, 5, 5]
