# gpufleet — every target bootstraps what it needs (a .venv, and as root the lab's Debian packages).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Debian packages the lab, Molecule and the integration tests need on the control node.
LAB_PACKAGES := systemd-container debootstrap git-lfs iptables iproute2 openssh-client binutils
PYTEST_ARGS ?=
# Both cores: every test file goes whole to one of two workers, longest first (tests/conftest.py says why).
PARALLEL := -n 2 --dist loadfile --no-loadscope-reorder
# Let Python keep the bytecode of the checkout's modules (src/, plugins/: gitignored __pycache__): with
# PYTHONDONTWRITEBYTECODE set (this machine sets it), every Ansible worker compiled gpufleet's sources again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-all check lint unit integration molecule venv lab-prereqs lab-stress clean

demo: lab-prereqs $(STAMP)  ## validate and plan inventories/prod; then the air-gapped deployment on 3 lab hosts
	$(BIN)/gpufleet validate -i inventories/prod
	$(BIN)/gpufleet plan -i inventories/prod
	$(BIN)/python -m gpufleet.lab.demo  # lab bundle, 3 offline lab hosts (lab "demo", left up), two services, a chat with each

test: lab-prereqs $(STAMP)  ## what CI runs: the pytest suite less the `heavy` tests, linters included (tests/test_lint.py)
	$(BIN)/pytest $(PARALLEL) --durations=40 -m "not heavy" $(PYTEST_ARGS)

test-all: lab-prereqs $(STAMP)  ## everything, the heavy tests too (CUDA packages, serving scenarios)
	$(BIN)/pytest $(PARALLEL) --durations=40 $(PYTEST_ARGS)

check: $(STAMP)  ## the inner loop (about 2.5 min): the linters and the unit tests, on both cores
	$(BIN)/pytest -q $(PARALLEL) tests/test_lint.py tests/unit $(PYTEST_ARGS)

lab-stress: lab-prereqs $(STAMP)  ## 50 lab up/down cycles and 50 resets, two labs side by side (not in make test)
	$(BIN)/python benchmarks/lab_stress.py --markdown benchmarks/results/lab-stress.md

lint: $(STAMP)
	$(BIN)/yamllint --strict .
	$(BIN)/ruff check conftest.py src tests plugins roles molecule benchmarks images
	$(BIN)/ruff format --check conftest.py src tests plugins roles molecule benchmarks images
	$(BIN)/mypy
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/antsibull-changelog lint
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-lint --profile production --strict

unit: $(STAMP)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,lab]'
	touch $@

lab-prereqs:  ## the lab's Debian packages (root only; skipped when present)
	@missing=""; for p in $(LAB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing (run as root: apt-get install$$missing)"; exit 1; fi; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache dist
