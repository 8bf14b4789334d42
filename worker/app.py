"""The Celery app: `celery -A worker.app:app worker -Q compile.cpu` (or `fusewire worker`).

Broker and every option come from `service.settings.Settings` (env FUSEWIRE_*), through
`worker.config`. Tasks are in `worker.tasks`; heartbeats for /readyz in `worker.heartbeat`.
"""

from service.settings import get_settings
from worker.config import make_celery

app = make_celery(get_settings(), include=("worker.tasks", "worker.heartbeat"))
