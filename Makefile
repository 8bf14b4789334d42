# The two commands of the README's quickstart.
.PHONY: up test setup

setup:
	@./scripts/bootstrap.sh

# Start the whole local stack: redis-server, a Celery worker and the API on localhost.
up: setup
	@.venv/bin/fusewire up

# Run the whole test suite (exit 5, "no tests collected", counts as failure), in two processes
# (pytest-xdist; the CI machine has two cores): 19 minutes there, against about 26 in one.
test: setup
	@TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -n 2 tests
