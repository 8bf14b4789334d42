"""Celery configuration in one place, shared by the worker and the API (which only sends).

Torch-free: the API imports this to enqueue jobs by task name and queue.
"""

from __future__ import annotations

from celery import Celery

from service.settings import Settings

TASK_NAME = "fusewire.compile"


def queue_for(target: str) -> str:
    """The Celery queue of a target: 'cpu' -> 'compile.cpu', 'cuda:sm_90' -> 'compile.cuda.sm_90'."""
    return "compile." + target.replace(":", ".")


def celery_config(settings: Settings) -> dict:
    return {
        "broker_url": settings.redis_url,
        "broker_transport_options": {
            "global_keyprefix": settings.key_prefix,  # Celery's keys live beside ours, under one prefix
            "visibility_timeout": settings.visibility_timeout_s,  # unacked task redelivered after this
            "unacked_restore_interval": settings.unacked_restore_interval_s,
            "unacked_restore_throttle": 1,
            "socket_timeout": 30,
            "socket_connect_timeout": 10,
        },
        "broker_connection_retry_on_startup": True,
        "task_ignore_result": True,  # job state lives in job:{key}, not in a result backend
        "result_backend": None,
        "task_acks_late": True,  # ack after the compile: a worker that dies loses nothing
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "task_soft_time_limit": settings.soft_time_limit_s,
        "task_time_limit": settings.hard_time_limit_s,
        "worker_prefetch_multiplier": 1,  # a worker holds one compile at a time, no hoarding
        "worker_proc_alive_timeout": 120,  # a child imports torch before it reports ready
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "task_default_queue": queue_for("cpu"),
        "task_create_missing_queues": True,
        "task_publish_retry": True,
        "task_publish_retry_policy": {"max_retries": 3, "interval_start": 0.1, "interval_step": 0.5, "interval_max": 2},
    }


def make_celery(settings: Settings, include: tuple[str, ...] = ()) -> Celery:
    app = Celery("fusewire", include=list(include))
    app.conf.update(celery_config(settings))
    return app
