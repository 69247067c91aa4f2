"""The example notebooks run top to bottom, so that they cannot rot, and match their percent-format sources.

Each notebook is generated from a plain Python script (``notebooks/NN_*.py``, jupytext's "py:percent" format) by
``notebooks/build.py``; the committed ``.ipynb`` must have the script's cells (sources, types, tags).
Each notebook is executed in quick mode (``GLAS_NOTEBOOK_QUICK=1``: small sizes) on a copy in a temporary
folder; the committed files are never rewritten. The kernel is an IPython kernel started from this test's
own interpreter (``sys.executable -m ipykernel_launcher``) through a kernel spec written to a temporary
folder, so nothing has to be registered with Jupyter, and a kernel named "python3" elsewhere on the machine
(another environment's) cannot be picked up by mistake.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
kernelspec = pytest.importorskip("jupyter_client.kernelspec")
manager = pytest.importorskip("jupyter_client.manager")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = ["01_sine_1d.ipynb", "02_concrete.ipynb", "03_sklearn_workflows.ipynb", "04_digits_cnn.ipynb",
             "05_smiles_tokens.ipynb", "06_transformers_lora.ipynb"]
SOURCES = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))
KERNEL_NAME = "glas-sklearn-test"
CELL_TIMEOUT = 600  # seconds per cell; a quick run takes well under a minute per notebook


@pytest.fixture(scope="module")
def kernel_spec_manager(tmp_path_factory):
    """A KernelSpecManager that knows one kernel: ipykernel on this interpreter, in quick mode."""
    kernels = tmp_path_factory.mktemp("kernels")
    spec = kernels / KERNEL_NAME
    spec.mkdir()
    env = {
        "GLAS_NOTEBOOK_QUICK": "1",
        # the checkout first, so that the kernel imports this glas_sklearn even when it is not installed
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
    }
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "glas-sklearn tests", "language": "python", "env": env,
    }))
    return kernelspec.KernelSpecManager(kernel_dirs=[str(kernels)])


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_quick_mode(name, tmp_path, kernel_spec_manager):
    source = NOTEBOOK_DIR / name
    committed = source.read_bytes()
    work = tmp_path / name
    shutil.copyfile(source, work)
    nb = nbformat.read(work, as_version=4)
    for cell in _code_cells(nb):  # start from a clean slate: the committed outputs are full-mode ones
        cell.outputs, cell.execution_count = [], None

    km = manager.KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=kernel_spec_manager)
    client = nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, startup_timeout=180, record_timing=False,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails

    cells = _code_cells(nb)
    assert all(c.execution_count is not None for c in cells)
    errors = [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in cells for o in c.outputs if o.output_type == "stream")
    assert "(quick mode)" in text  # the kernel saw GLAS_NOTEBOOK_QUICK=1
    images = sum("image/png" in o.get("data", {}) for c in cells for o in c.outputs)
    assert images >= 1  # the plots were drawn inline
    assert source.read_bytes() == committed  # the committed notebook was not touched


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_is_executed(name):
    """The committed notebooks carry their (full-mode) outputs: every code cell ran, in order, without errors."""
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    nbformat.validate(nb)
    cells = _code_cells(nb)
    counts = [c.execution_count for c in cells]
    assert None not in counts, f"{name} has code cells that were not executed; run python notebooks/build.py --execute"
    assert counts == sorted(counts), f"{name} was not executed top to bottom"
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"]
    params = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "GLAS_NOTEBOOK_QUICK" in params[0].source
    text = "".join(o.get("text", "") for c in cells for o in c.outputs if o.output_type == "stream")
    assert "(full mode)" in text, f"{name} was committed with quick-mode outputs"


# An absolute path of the machine a notebook ran on (a warning's file name, a printed path): it means nothing to a
# reader and leaks the machine's layout.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:home|root|work|tmp|Users|opt|usr|var|private)/|\b[A-Z]:\\")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_saved_outputs_show_no_absolute_path(name):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    texts = [o.get("text", "") + "".join(str(v) for k, v in o.get("data", {}).items() if k.startswith("text/"))
             for c in _code_cells(nb) for o in c.outputs]
    found = [match.group(0) for text in texts for match in [_ABSOLUTE_PATH.search(text)] if match]
    assert not found, f"{name}: saved outputs show absolute paths of the machine it ran on: {found}"


def _cells(nb):
    return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]


def test_every_source_has_its_notebook():
    assert [Path(n).stem for n in NOTEBOOKS] == [Path(n).stem for n in SOURCES]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_matches_its_source(name):
    """The .ipynb holds exactly the cells of its .py source (rebuild with python notebooks/build.py --execute)."""
    jupytext = pytest.importorskip("jupytext")
    source = jupytext.read(NOTEBOOK_DIR / name.replace(".ipynb", ".py"), fmt="py:percent")
    committed = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    expected, got = _cells(source), _cells(committed)
    assert len(got) == len(expected), f"{name}: {len(got)} cells, its source has {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert g == e, f"{name}, cell {i}: differs from its source; run python notebooks/build.py --execute"
    assert [c["id"] for c in committed.cells] == [f"cell-{i:02d}" for i in range(len(got))]
