# Entry points for a fresh machine: `make demo` (the main job), `make test` and `make docs`.
# Each creates .venv with the CPU build of torch first (pinned), then installs what the target needs: the demo
# the package with matplotlib (`.[plot]`), the tests `.[test,plot]`, the docs `.[test,plot,docs]`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

.PHONY: venv demo paper-demo test docs docs-check bench-peers bench bench-quick reports notebooks clean

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	touch $@

$(VENV)/.demo-installed: $(VENV)/.torch pyproject.toml
	$(PY) -m pip install -q -e ".[plot]"
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml
	$(PY) -m pip install -q -e ".[test,plot]"
	touch $@

venv: $(VENV)/.installed

# The default regressor on the shipped concrete data: its intervals, their coverage on held-out rows, a plot.
demo: $(VENV)/.demo-installed
	$(PY) -m glas_sklearn demo

# The paper's study on the same data: its method (d chosen by coverage) at both posterior scalings, compared.
paper-demo: $(VENV)/.demo-installed
	$(PY) -m glas_sklearn demo --paper

test: venv
	$(PY) -m pytest -q

# The documentation site (Sphinx) into docs/_build/html, warnings as errors; the notebooks are rendered with
# their saved outputs, not executed.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e ".[test,plot,docs]"
	touch $@

docs: $(VENV)/.docs-installed
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# The built site opened in headless Chromium with no network: every formula must be typeset by the MathJax the
# site serves itself (screenshots in docs/_build/math-check/ to look at). Needs chromium (apt-get install chromium).
docs-check: docs
	$(PY) docs/check_math.py docs/_build/html

# The benchmarks (benchmarks/run.py, see benchmarks/README.md) with their peers, never replacing the CPU torch.
# `make bench` runs them all in full (hours; results into benchmarks/results/), `make bench-quick` their smoke runs
# (minutes; outputs under $(QUICK_DIR), not in results/), `make reports` re-renders the committed reports from their
# JSON (no computation).
QUICK_DIR ?= /tmp/glas-bench-quick
# NGBoost (a tabular peer of uci.py and regional_coverage.py) pins an older scikit-learn than ours: installed without
# its dependencies (it needs none beyond what the package already has).
bench-peers: venv
	$(PY) -m pip install -q -c benchmarks/constraints.txt -e ".[bench]"
	$(PY) -m pip install -q -c benchmarks/constraints.txt --no-deps ngboost
	$(PY) -m pip uninstall -y -q torchvision || true

bench: bench-peers
	$(PY) benchmarks/run.py

bench-quick: venv
	$(PY) benchmarks/run.py --quick --out-dir $(QUICK_DIR)

reports: venv
	$(PY) benchmarks/run.py --report-only

# The example notebooks generated from their percent-format sources and executed in full mode (≈ 3 min).
notebooks: venv
	$(PY) notebooks/build.py --execute

clean:
	rm -rf $(VENV) build *.egg-info docs/_build docs/api docs/gallery/generated docs/benchmarks/generated
