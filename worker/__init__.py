"""The fusewire compile worker: a Celery app (`worker.app:app`) whose one task compiles a
submitted graph and stores the artifact. Importing this package imports neither torch
nor triton; the task imports the compiler when it first runs."""
