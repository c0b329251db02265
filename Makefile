# plansim: two set-up commands for a fresh machine.
#   make demo   install what is needed, then rank layouts for GPT-3 175B on 1024 A100-80GB
#   make test   install what is needed (torch==2.13.0 CPU build included), lint, type-check, test
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.plansim-installed

.PHONY: demo test docs docs-data lint typecheck unit install install-test install-browser clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q -e .
	touch $(STAMP)

install: $(STAMP)

# torch: keep an installed torch that is compatible (>= 2.3); otherwise take the pinned CPU build.
install-test: install
	@$(PY) -c "import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(0 if v >= (2, 3) else 1)" 2>/dev/null \
		|| $(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test,docs]" nbclient nbformat ipykernel
# framework parsers of tests/unit/test_export_frameworks.py (extra "frameworks"): --no-deps
# so torch is never replaced (deepspeed's build imports the installed torch), then the
# small pure-Python packages their config parsers import
	DS_BUILD_OPS=0 $(PIP) install -q --no-deps --no-build-isolation \
		"megatron-core==0.16.1" "torchtitan==0.2.2" "deepspeed==0.19.8"
	$(PIP) install -q tyro einops hjson msgpack ninja py-cpuinfo "pydantic>=2"

# headless Chromium for the HTML report's browser test (Debian's package); the test skips with
# the reason when it could not be installed
install-browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
		|| (command -v apt-get >/dev/null 2>&1 && { apt-get install -y -q chromium >/dev/null 2>&1 \
			|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }) \
		|| echo "chromium could not be installed: the HTML report's browser test will be skipped"

demo: install
	$(VENV)/bin/plansim plan --model gpt3-175b --gpu a100-sxm4-80gb --gpus 1024 --gbs 1536

# the documentation site (mkdocs.yml) into site/, strict: a broken link or docstring fails
docs: install-test
	$(VENV)/bin/mkdocs build --strict

# regenerate what the docs show: every back-test (minutes), the command outputs and pictures,
# the CLI reference
docs-data: install-test
	$(PY) docs/gen/accuracy.py run
	$(PY) docs/gen/accuracy.py render
	$(PY) docs/gen/examples.py
	$(PY) docs/gen/cli_reference.py
	$(PY) docs/gen/framework_releases.py

lint:
	$(VENV)/bin/ruff check plansim tests benchmarks docs
	$(VENV)/bin/ruff format --check plansim tests benchmarks docs

typecheck:
	$(VENV)/bin/mypy

unit:
	$(PY) -m pytest

test: install-test install-browser lint typecheck unit

clean:
	rm -rf $(VENV) build *.egg-info
