"""One router per resource: submit (POST /compile), jobs, artifacts, health (+ metrics)."""
