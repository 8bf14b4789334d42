"""Worker heartbeats for /readyz: a thread in the worker's main process refreshes
`worker:{hostname}` (with the queues it consumes) every few seconds."""

from __future__ import annotations

import logging
import os
import threading
import time

from celery.signals import worker_process_init, worker_ready, worker_shutdown

from service.settings import get_settings
from service.store import Store

log = logging.getLogger("fusewire.worker")
_stop = threading.Event()
_state: dict = {}


@worker_ready.connect
def start_heartbeat(sender=None, **_):
    settings = get_settings()
    hostname = sender.hostname
    queues = sorted(q.name for q in sender.task_consumer.queues) if sender.task_consumer else []
    info = {"queues": queues, "pid": os.getpid(), "started": time.time()}
    store = Store.from_settings(settings)
    _state.update(store=store, hostname=hostname)

    def beat():
        while not _stop.is_set():
            try:
                store.heartbeat(hostname, info, settings.heartbeat_ttl_s)
            except Exception:  # Redis away: /readyz will say so; keep trying
                log.warning("heartbeat to Redis failed", exc_info=True)
            _stop.wait(settings.heartbeat_interval_s)

    threading.Thread(target=beat, name="fusewire-heartbeat", daemon=True).start()
    log.info("fusewire worker %s ready, queues %s", hostname, ", ".join(queues))


@worker_shutdown.connect
def stop_heartbeat(**_):
    _stop.set()
    if "store" in _state:
        try:
            _state["store"].forget_worker(_state["hostname"])
        except Exception:
            pass


@worker_process_init.connect
def preload_compiler(**_):
    """A pool child imports the compiler (and torch) before its first task, not during it, and on
    a GPU worker starts the cubin build servers (compiler/codegen/aot.py)."""
    try:
        import compiler  # noqa: F401
        import compiler.graph  # noqa: F401
        import torch

        if torch.cuda.is_available():  # a GPU worker builds cubins: start its build servers now
            from compiler.codegen.aot import build_pool

            build_pool().warm()
    except Exception:  # the task reports a broken compiler per job; the child must still start
        log.warning("preloading the compiler failed", exc_info=True)
