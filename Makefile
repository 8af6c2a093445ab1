# The two newcomer commands (see README): `make demo` runs the main job, `make test` the tests.
# Both install what they need first (scripts/bootstrap.sh is idempotent).
.PHONY: bootstrap demo test lint ladder

bootstrap:
	bash scripts/bootstrap.sh

demo: bootstrap
	.venv/bin/tenure up

lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

test: lint
	.venv/bin/python -m pytest -q

ladder: bootstrap
	.venv/bin/tenure replay ladder --trace ../shared/traces/claude_code/sessions.jsonl.gz
