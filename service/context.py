"""What every request handler needs, built once per app: settings, store, auth, cache, queue."""

from __future__ import annotations

from dataclasses import dataclass, field

from celery import Celery
from prometheus_client import CollectorRegistry

from service.auth import Auth
from service.cache import ArtifactCache
from service.metrics import RedisCollector
from service.settings import Settings
from service.store import Store


@dataclass
class Context:
    settings: Settings
    store: Store
    auth: Auth
    cache: ArtifactCache
    celery: Celery
    metrics_registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    @classmethod
    def build(cls, settings: Settings) -> "Context":
        from worker.config import make_celery  # torch-free: the API only sends tasks by name

        store = Store.from_settings(settings)
        ctx = cls(settings, store, Auth(settings.token_table()), ArtifactCache(settings.artifact_cache_bytes),
                  make_celery(settings))
        ctx.metrics_registry.register(RedisCollector(store, settings))
        return ctx
