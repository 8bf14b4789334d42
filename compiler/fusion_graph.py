"""The dependency graph between the scheduler's steps while fusion merges them.

Nodes are steps (kernel groups and extern calls), named by any hashable key; an edge a -> b
says a runs before b. Every node carries a rank, and the ranks always form a topological
order, kept up to date as merges contract pairs of nodes (the reordering of Pearce and
Kelly's dynamic topological sort, applied to a contraction). With ranks, the questions
fusion asks look only at the nodes ranked between the two it is about:

- `creates_cycle(a, b)`: would merging a and b create a cycle, i.e. does a path of at least
  two edges lead from one to the other (through a third node)? Without ranks this walked
  the whole graph for every candidate pair, quadratic in the graph's size.
- `separable_partners(users)`: of the pairs of nodes that share a buffer, those not already
  known to be refused: a pair (u, w) with a third user v on a path u -> v -> w can never be
  merged (the merge would create a cycle through v), so the scheduler need not list it. A
  buffer read by every step of a long chain has a quadratic number of pairs, nearly all
  of that kind.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Hashable, Iterable

Key = Hashable


class StepGraph:
    """Edges between steps, and a topological rank per step kept valid under merges."""

    def __init__(self, keys: Iterable[Key], edges: Iterable[tuple[Key, Key]], order: dict[Key, int]) -> None:
        """`edges` (before, after) between `keys`; `order` breaks ties of the initial ranks."""
        self.succ: dict[Key, set[Key]] = {k: set() for k in keys}
        self.pred: dict[Key, set[Key]] = {k: set() for k in self.succ}
        for before, after in edges:
            if before != after:
                self.succ[before].add(after)
                self.pred[after].add(before)
        self.rank: dict[Key, int] = {k: i for i, k in enumerate(self._kahn(order))}
        self._by_rank: list[tuple[int, Key]] | None = None

    def _kahn(self, order: dict[Key, int]) -> list[Key]:
        waiting = {k: len(p) for k, p in self.pred.items()}
        ready = [(order[k], i, k) for i, k in enumerate(self.succ) if not waiting[k]]
        heapq.heapify(ready)
        result: list[Key] = []
        tie = len(ready)
        while ready:
            _, _, key = heapq.heappop(ready)
            result.append(key)
            for after in self.succ[key]:
                waiting[after] -= 1
                if not waiting[after]:
                    tie += 1
                    heapq.heappush(ready, (order[after], tie, after))
        if len(result) != len(self.succ):
            raise ValueError("the dependency graph has a cycle")
        return result

    def __len__(self) -> int:
        return len(self.succ)

    # --- queries ---------------------------------------------------------------------

    def creates_cycle(self, a: Key, b: Key) -> bool:
        """Whether a path of two or more edges joins a and b (either way): merging them would
        make the merged node depend on itself."""
        first, last = (a, b) if self.rank[a] < self.rank[b] else (b, a)
        return last in self._reach_below(first, last, stop_at=last)

    def _reach_below(self, start: Key, end: Key, stop_at: Key | None = None) -> set[Key]:
        """Nodes reachable from `start` through nodes ranked below `end`, `end` itself excluded;
        with `stop_at`, returns as soon as a node reached (not `start`) has it as a successor
        (the result then holds `stop_at`). Highest rank first: a path to `end` goes up."""
        limit = self.rank[end]
        seen: set[Key] = set()
        frontier = [(-self.rank[s], s) for s in self.succ[start] if s != end and self.rank[s] < limit]
        heapq.heapify(frontier)
        while frontier:
            _, node = heapq.heappop(frontier)
            if node in seen:
                continue
            seen.add(node)
            successors = self.succ[node]
            if stop_at is not None and stop_at in successors:
                seen.add(stop_at)
                return seen
            for s in successors:
                if s not in seen and self.rank[s] < limit:
                    heapq.heappush(frontier, (-self.rank[s], s))
        return seen

    def _reach_above_backwards(self, start: Key, end: Key) -> set[Key]:
        """Nodes from which `end` is reached, ranked above `start`, `start` excluded."""
        limit = self.rank[start]
        seen: set[Key] = set()
        stack = [p for p in self.pred[end] if p != start and self.rank[p] > limit]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            stack.extend(p for p in self.pred[node] if p not in seen and self.rank[p] > limit)
        return seen

    # --- merging -----------------------------------------------------------------------

    def merge(self, a: Key, b: Key, merged: Key) -> None:
        """Contracts a and b (no cycle: see creates_cycle) into the new node `merged`.

        With first ranked below last, the merged node takes a place after everything that
        leads to last and before everything that first leads to; the nodes ranked between
        them that must move are reordered within their own ranks, nothing else moves."""
        first, last = (a, b) if self.rank[a] < self.rank[b] else (b, a)
        after = self._reach_below(first, last)
        before = self._reach_above_backwards(first, last)
        if after & before:
            raise AssertionError("merging these steps creates a cycle")
        slots = sorted([self.rank[n] for n in after | before] + [self.rank[last]])
        sequence = sorted(before, key=self.rank.__getitem__) + [merged] + sorted(after, key=self.rank.__getitem__)
        succ = (self.succ.pop(first) | self.succ.pop(last)) - {first, last}
        pred = (self.pred.pop(first) | self.pred.pop(last)) - {first, last}
        del self.rank[first], self.rank[last]
        for node, slot in zip(sequence, slots):
            self.rank[node] = slot
        self.succ[merged], self.pred[merged] = succ, pred
        for s in succ:
            self.pred[s] -= {first, last}
            self.pred[s].add(merged)
        for p in pred:
            self.succ[p] -= {first, last}
            self.succ[p].add(merged)
        self._by_rank = None

    # --- pairs worth trying ----------------------------------------------------------

    def separable_partners(self, users: list[Key]) -> list[int]:
        """For each of `users` (distinct nodes), a bit mask of the later users (bit j: users[j],
        j > i) it may pair with: all but those with another user on a path between the two.
        Merging such a pair would close a cycle through that user, now and after any later
        merge of other nodes."""
        index = {u: i for i, u in enumerate(users)}
        inside = self._ranked_between(min(self.rank[u] for u in users), max(self.rank[u] for u in users))
        through_desc = self._through_users(inside[::-1], self.succ, index)
        through_anc = self._through_users(inside, self.pred, index)
        everyone = (1 << len(users)) - 1
        return [everyone & ~(through_desc[u] | through_anc[u]) & ~((1 << (i + 1)) - 1) for i, u in enumerate(users)]

    def span(self, users: list[Key]) -> int:
        """How many nodes are ranked between the first and the last of `users` (inclusive)."""
        start, stop = self._rank_slice(min(self.rank[u] for u in users), max(self.rank[u] for u in users))
        return stop - start

    def _ranked(self) -> list[tuple[int, Key]]:
        if self._by_rank is None:
            self._by_rank = sorted(((r, k) for k, r in self.rank.items()), key=lambda item: item[0])
        return self._by_rank

    def _rank_slice(self, low: int, high: int) -> tuple[int, int]:
        ranked = self._ranked()
        return (bisect.bisect_left(ranked, low, key=lambda item: item[0]),
                bisect.bisect_right(ranked, high, key=lambda item: item[0]))

    def _ranked_between(self, low: int, high: int) -> list[Key]:
        start, stop = self._rank_slice(low, high)
        return [k for _, k in self._ranked()[start:stop]]

    def _through_users(self, walk: list[Key], edges: dict[Key, set[Key]], index: dict[Key, int]) -> dict[Key, int]:
        """Per node of `walk` (in an order where every node comes after its `edges` targets that
        are in `walk`), the users (bit i: users[i]) it reaches along `edges` through another user."""
        reach: dict[Key, int] = {}
        through: dict[Key, int] = {}
        for node in walk:
            direct = via = 0
            for other in edges[node]:
                if other not in reach:
                    continue  # outside the users' span: leads to no user
                direct |= reach[other]
                via |= through[other]
                if other in index:
                    direct |= 1 << index[other]
                    via |= reach[other]
            reach[node], through[node] = direct, via
        return through
