"""Python's cyclic garbage collector, paused while a compile stage runs.

A stage allocates millions of small objects (sympy expressions, IR nodes, closures) and
keeps most of them to the end of the compile; each full collection walks all of them,
and there are several per compile as the heap grows: about 30 % of a 20,000-node compile.
Nothing a stage makes relies on the collector (reference counting frees it; the few
cycles, such as an fx graph traced for a decomposition, wait for the next collection after
the stage), so the collector is switched off for the stage and on again after it.

Process-wide, like the collector: with stages of several compiles overlapping in threads,
only the first to pause it resumes it, so it may run during the others' stages. That costs
time, never correctness.
"""

from __future__ import annotations

import functools
import gc
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def paused_gc(stage: F) -> F:
    """Decorates a stage function: the collector is off while it runs (if it was on)."""
    @functools.wraps(stage)
    def run(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return stage(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return run  # type: ignore[return-value]
