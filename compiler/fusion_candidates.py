"""One fusion round's candidate pairs, ranked, as numpy arrays.

The scheduler tries pairs of steps that share a buffer, best first: most bytes saved (the
shared buffers that one kernel reads or writes once instead of twice), then the closest,
then the order in which they were found (buffer by buffer in the order the steps first touch
them; within a buffer, its users by program order, pairs in lexicographic order). A pair a
step of which has already fused this round is skipped.

A graph input read by thousands of steps gives millions of pairs; nearly all are skipped, but
each used to cost a Python tuple, a score and a place in a sorted list. Here a buffer's pairs
are arrays, a pair's score is summed over the buffers it shares with `np.add.at`, the ranking
is one `np.lexsort`, and `live_pairs` filters whole chunks of skipped pairs in numpy.

A buffer with many users (a "hub", `add_hub`) still has a number of pairs quadratic in its
users when they do not depend on each other. Its pairs more than `NEAR` program positions
apart are listed only when the round gets to pairs that far apart, and then only between
steps that have not fused yet: by then, nearly all have. The order does not change: until
then every pair tried is better than any of the far ones could be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

NEAR = 256  # program positions


@dataclass
class _Hub:
    index: int  # the buffer's position in the order buffers were found
    users: np.ndarray  # steps, by program order
    partners: list[int]  # per user i, a bit mask of the later users j it may pair with
    near: list[int]  # the part of partners[i] within NEAR positions (listed at once)
    accessed: np.ndarray
    nbytes: int


class Candidates:
    """Collects pairs buffer by buffer (`add`, `add_hub`), then yields them best first
    (`live_pairs`). Steps are numbered 0..count-1; `order[s]` and `last[s]` are the program
    positions of step s's first and last node, `extern[s]` whether it is an extern call (two
    extern calls never make a pair)."""

    def __init__(self, order: np.ndarray, last: np.ndarray, extern: np.ndarray) -> None:
        self.order, self.last, self.extern = order, last, extern
        self.count = len(order)
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # first, second, gain, found
        self._small: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])  # the same, from add_few
        self._hubs: list[_Hub] = []

    def add_few(self, index: int, users: list[int], accessed: list[bool], nbytes: int) -> None:
        """`add` with every pair of a few users, in plain Python: most buffers have two or three
        users, and numpy's overhead per call would dominate."""
        first, second, gain, found = self._small
        base = index * self.count
        for i, a in enumerate(users):
            for j in range(i + 1, len(users)):
                b = users[j]
                if not (self.extern[a] and self.extern[b]):
                    first.append(a)
                    second.append(b)
                    gain.append(nbytes if accessed[i] and accessed[j] else 0)
                    found.append((base + i) * self.count + j)

    def add(self, index: int, users: np.ndarray, pairs: tuple[np.ndarray, np.ndarray], accessed: np.ndarray,
            nbytes: int) -> None:
        """The pairs of the index-th buffer: `users` its steps sorted by program order, `pairs`
        (i, j) positions in `users` in lexicographic order, `accessed[i]` whether users[i] reads
        or writes it through an index (the bytes count for a pair only when both do)."""
        i, j = (np.asarray(p, dtype=np.int64) for p in pairs)
        first, second = users[i], users[j]
        keep = ~(self.extern[first] & self.extern[second])
        gain = np.where(accessed[i] & accessed[j], np.int64(nbytes), np.int64(0))
        found = (index * self.count + i) * self.count + j
        self._parts.append((first[keep], second[keep], gain[keep], found[keep]))

    def add_hub(self, index: int, users: np.ndarray, partners: list[int], accessed: np.ndarray, nbytes: int) -> None:
        """Like `add`, the pairs given as `partners` bit masks (bit j of partners[i]: the pair (i, j));
        those more than NEAR positions apart wait (see the module's docstring)."""
        users_order = self.order[users]
        near: list[int] = []
        for i, mask in enumerate(partners):
            low = max(i + 1, int(np.searchsorted(users_order, self.last[users[i]] - NEAR, "left")))
            high = int(np.searchsorted(users_order, self.last[users[i]] + NEAR, "right"))
            window = ((1 << high) - 1) & ~((1 << low) - 1) if high > low else 0
            near.append(mask & window)
        self.add(index, users, _pairs_of(near), accessed, nbytes)
        self._hubs.append(_Hub(index, users, partners, near, accessed, nbytes))

    # --- ranking ---------------------------------------------------------------------

    def live_pairs(self, dead: np.ndarray, chunk: int = 1024) -> Iterator[tuple[int, int]]:
        """The pairs best first, less those with a step marked in `dead` by the time the pair
        comes up (the caller marks steps as it fuses them, between pairs)."""
        small = tuple(np.array(column, dtype=np.int64) for column in self._small)
        first, second, saved, distance, found = self._ranked(*self._merged(self._parts + [small]))
        if self._hubs:
            # the far pairs save at most `bound` bytes and are over NEAR apart: all pairs ranked
            # better than that come first (a prefix), then the rest and the far pairs whose steps
            # are still alive, ranked anew
            bound = self._far_bound()
            better = int(((saved > bound) | ((saved == bound) & (distance <= NEAR))).sum())
            yield from _alive(first[:better], second[:better], dead, chunk)
            listed = set((first * self.count + second).tolist())
            alive = ~(dead[first[better:]] | dead[second[better:]])
            rest = [tuple(column[better:][alive] for column in (first, second, saved, found))]
            first, second, saved, distance, found = self._ranked(*self._merged(rest + self._far_pairs(dead, listed),
                                                                               summed=True))
        yield from _alive(first, second, dead, chunk)

    def _merged(self, parts: list, summed: bool = False) -> tuple[np.ndarray, ...]:
        """Each pair once: its bytes saved summed over its buffers and where it was first found
        (`summed`: parts whose pairs already hold their total)."""
        if not parts:
            return tuple(np.zeros(0, dtype=np.int64) for _ in range(4))
        first, second, gain, found = (np.concatenate(column) for column in zip(*parts))
        codes = first * self.count + second
        unique, which = np.unique(codes, return_inverse=True)
        which = which.reshape(-1)
        saved = np.zeros(len(unique), dtype=np.int64)
        np.add.at(saved, which, gain)
        earliest = np.full(len(unique), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(earliest, which, found)
        first, second = unique // self.count, unique % self.count
        if not summed and self._hubs:
            saved, earliest = self._add_far_occurrences(first, second, saved, earliest)
        return first, second, saved, earliest

    def _ranked(self, first: np.ndarray, second: np.ndarray, saved: np.ndarray, found: np.ndarray) -> tuple:
        distance = np.abs(self.order[second] - self.last[first])
        best = np.lexsort((found, distance, -saved))  # the last key sorts first
        return first[best], second[best], saved[best], distance[best], found[best]

    # --- the far pairs of hubs ---------------------------------------------------------

    def _add_far_occurrences(self, first: np.ndarray, second: np.ndarray, saved: np.ndarray,
                             found: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A pair listed now (through another buffer) may also be a far pair of a hub: count
        that hub's bytes and where it was found there too."""
        far = np.flatnonzero(np.abs(self.order[second] - self.last[first]) > NEAR)
        if not len(far):
            return saved, found
        saved, found = saved.copy(), found.copy()
        for hub in self._hubs:
            position = np.full(self.count, -1, dtype=np.int64)
            position[hub.users] = np.arange(len(hub.users))
            i, j = position[first[far]], position[second[far]]
            for k in np.flatnonzero((i >= 0) & (j >= 0)).tolist():
                a, b = int(i[k]), int(j[k])
                if hub.partners[a] >> b & 1 and not hub.near[a] >> b & 1:
                    saved[far[k]] += hub.nbytes if hub.accessed[a] and hub.accessed[b] else 0
                    found[far[k]] = min(found[far[k]], (hub.index * self.count + a) * self.count + b)
        return saved, found

    def _far_bound(self) -> int:
        """The most bytes a far pair can save: its hubs' bytes, at most those its first step accesses."""
        per_step = np.zeros(self.count, dtype=np.int64)
        for hub in self._hubs:
            per_step[hub.users[hub.accessed]] += hub.nbytes
        return int(per_step.max())

    def _far_pairs(self, dead: np.ndarray, listed: set[int]) -> list:
        """The far pairs between steps not dead, less those already listed through another buffer."""
        parts = []
        for hub in self._hubs:
            alive = int.from_bytes(np.packbits(~dead[hub.users], bitorder="little").tobytes(), "little")
            far = [(mask & ~near & alive) if alive >> i & 1 else 0
                   for i, (mask, near) in enumerate(zip(hub.partners, hub.near))]
            i, j = _pairs_of(far)
            first, second = hub.users[i], hub.users[j]
            keep = ~(self.extern[first] & self.extern[second])
            keep &= np.array([code not in listed for code in (first * self.count + second).tolist()], dtype=bool)
            gain = np.where(hub.accessed[i] & hub.accessed[j], np.int64(hub.nbytes), np.int64(0))
            found = (hub.index * self.count + i) * self.count + j
            parts.append((first[keep], second[keep], gain[keep], found[keep]))
        return parts


def _pairs_of(masks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) for every bit j of masks[i], in lexicographic order."""
    firsts: list[int] = []
    seconds: list[int] = []
    for i, mask in enumerate(masks):
        if not mask:
            continue
        later = set_bits(mask, len(masks)).tolist() if mask.bit_count() > 16 else _few_bits(mask)
        firsts += [i] * len(later)
        seconds += later
    return np.array(firsts, dtype=np.int64), np.array(seconds, dtype=np.int64)


def _few_bits(mask: int) -> list[int]:
    bits = []
    while mask:
        low = mask & -mask
        bits.append(low.bit_length() - 1)
        mask ^= low
    return bits


def _alive(first: np.ndarray, second: np.ndarray, dead: np.ndarray, chunk: int) -> Iterator[tuple[int, int]]:
    for start in range(0, len(first), chunk):
        a, b = first[start:start + chunk], second[start:start + chunk]
        alive = ~(dead[a] | dead[b])
        for x, y in zip(a[alive].tolist(), b[alive].tolist()):
            if not (dead[x] or dead[y]):
                yield x, y


def live_pairs(first: np.ndarray, second: np.ndarray, dead: np.ndarray, chunk: int = 1024) -> Iterator[tuple[int, int]]:
    """Ranked pairs in order, less those with a step marked in `dead` by the time they come up."""
    return _alive(first, second, dead, chunk)


def set_bits(mask: int, width: int) -> np.ndarray:
    """Positions of the set bits of a non-negative int below 2**width, ascending."""
    raw = np.frombuffer(mask.to_bytes((width + 7) // 8 or 1, "little"), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(raw, bitorder="little"))
