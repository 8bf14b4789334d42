# The two commands of the README's quickstart.
.PHONY: up test setup

setup:
	@./scripts/bootstrap.sh

# Start the whole local stack: redis-server, a Celery worker and the API on localhost.
up: setup
	@.venv/bin/fusewire up

# Run the whole test suite (exit 5, "no tests collected", counts as failure), in two processes
# (pytest-xdist; the CI machine has two cores): about 23 minutes there since the eleventh held-out group's
# model tests were added (22:49, 2026-11-29); in one process the suite took 23:40 before the seventh's were.
test: setup
	@TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -n 2 tests
