"""Autotuning results shared through Redis: the first writer decides for every worker."""

from __future__ import annotations

from worker.tasks import StoreTuningCache


def test_tuning_results_round_trip_and_are_written_once(store):
    cache = StoreTuningCache(store)
    assert cache.get("kernel-abc") is None
    cache.put("kernel-abc", {"chosen": 2, "ms": [0.3, 0.2, 0.1]})
    cache.put("kernel-abc", {"chosen": 0, "ms": [9.0]})  # a later worker's timings do not replace it
    assert cache.get("kernel-abc") == {"chosen": 2, "ms": [0.3, 0.2, 0.1]}
