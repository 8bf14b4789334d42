"""A per-process LRU of verified artifact bundles, bounded in bytes.

Artifacts are immutable and content-addressed, so a copy verified once (digest checked
when read from Redis) can be served again without Redis or re-hashing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class ArtifactCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[bytes, str] | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: str, blob: bytes, digest: str) -> None:
        if len(blob) > self.max_bytes // 4:  # one huge bundle must not flush everything else
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = (blob, digest)
            self.bytes += len(blob)
            while self.bytes > self.max_bytes:
                _, (old, _) = self._items.popitem(last=False)
                self.bytes -= len(old)
