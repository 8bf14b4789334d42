"""The model zoo's tests run against the real stack of tests/conftest.py (redis-server, a CPU
Celery worker, the API); this folder is on sys.path, so `import zoo` and `import accuracy` work."""
