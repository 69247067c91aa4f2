# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Both create .venv, install the CPU build of torch first (pinned), then the project.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

.PHONY: venv demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,plot]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m glas_sklearn demo

test: venv
	$(PY) -m pytest -q

# Peers for the benchmarks, never replacing the CPU torch (see benchmarks/README.md).
bench: venv
	$(PY) -m pip install -q -c benchmarks/constraints.txt -e ".[bench]"
	$(PY) -m pip uninstall -y -q torchvision || true
	$(PY) benchmarks/bench_ggn.py

clean:
	rm -rf $(VENV) build *.egg-info
