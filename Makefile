# The two newcomer commands (see README): `make demo` runs the main job, `make test` the tests.
# Both install what they need first (scripts/bootstrap.sh is idempotent).
.PHONY: bootstrap demo test lint docs docs-shots ladder

bootstrap:
	bash scripts/bootstrap.sh

# The demo needs the engine and the simulator, not the dev tools: a first `make demo` installs
# less (`make test` adds the rest).
demo:
	bash scripts/bootstrap.sh demo
	.venv/bin/tenure up

lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# The documentation site (mkdocs.yml, docs/): --strict fails on a broken link, a missing page,
# anchor or included file; the reference pages are generated from the code as it builds.
# No --quiet: it drops the warnings --strict counts, and a broken link then passes.
docs: bootstrap
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

# The home page and one reference page rendered by headless Chromium into docs/assets/shots/.
docs-shots: bootstrap
	bash scripts/docs_shots.sh

test: lint docs
	.venv/bin/python -m pytest -q --durations=25

ladder: bootstrap
	.venv/bin/tenure replay ladder --trace ../shared/traces/claude_code/sessions.jsonl.gz
