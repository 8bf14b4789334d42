"""The ASGI app: `uvicorn service.app:app` (or `fusewire serve`).

    create_app(settings) -> FastAPI    # tests build apps with their own settings
    app = create_app()                  # settings from the environment (FUSEWIRE_*)
"""

from __future__ import annotations

import logging

from fastapi import FastAPI

from compiler.version import FUSEWIRE_VERSION
from service import errors, openapi
from service.context import Context
from service.dashboard import routes as dashboard
from service.limits import BodySizeLimit
from service.metrics import MetricsMiddleware
from service.routes import artifacts, health, jobs, submit
from service.settings import Settings, get_settings

DESCRIPTION = """Shared compilation service: POST a captured ATen graph, get fused Triton
kernels back as an artifact keyed by the graph's content. Every team reads the shared
cache; submissions are rate-limited per team. Auth: `Authorization: Bearer <token>`."""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = FastAPI(title="fusewire", version=FUSEWIRE_VERSION, description=DESCRIPTION)
    app.state.ctx = Context.build(settings)
    app.state.ctx.auth.announce()
    errors.install(app)
    openapi.install(app, settings, open_auth=app.state.ctx.auth.open)
    for module in (submit, jobs, artifacts, health):
        app.include_router(module.router)
    app.include_router(dashboard.router)  # the web dashboard under /ui (docs/DASHBOARD.md), not in the schema
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(MetricsMiddleware)
    return app


app = create_app()
