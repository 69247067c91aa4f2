"""Write the example notebooks from their percent-format sources (``notebooks/NN_*.py``), optionally executed.

Each notebook's source is a plain Python script in jupytext's "py:percent" format (``# %%`` starts a code
cell, ``# %% [markdown]`` a markdown cell, ``# %% tags=["parameters"]`` the parameters cell); it is linted
like the rest of the code and runs as a script (``python notebooks/01_sine_1d.py``). The ``.ipynb`` next to it
is generated here; ``tests/test_notebooks.py`` checks that its cells equal the script's.

Usage (from the repository root; ``make notebooks`` runs the second line)::

    python notebooks/build.py                    # (re)write the three .ipynb files, without outputs
    python notebooks/build.py --execute          # write them and execute them in full mode, outputs stored
    python notebooks/build.py --execute --quick  # the same in quick mode (GLAS_NOTEBOOK_QUICK=1; a smoke run)
    python notebooks/build.py --execute 02       # only the notebooks whose file name contains "02"

The notebooks are executed with an IPython kernel started from *this* interpreter (``sys.executable -m
ipykernel_launcher``, through a kernel spec written to a temporary folder), so nothing has to be registered
with Jupyter and the kernel always sees the same environment as the script. The committed notebooks are
the ones written and executed here in full mode; edit the .py sources, not the .ipynb files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KERNEL_NAME = "glas-sklearn-notebooks"
SOURCES = sorted(HERE.glob("[0-9][0-9]_*.py"))
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def read_source(path: Path):
    """The notebook of a percent-format script: its cells, no outputs, deterministic cell ids."""
    import jupytext

    nb = jupytext.read(path, fmt="py:percent")
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):  # deterministic ids, so that rebuilding does not rewrite every cell
        cell["id"] = f"cell-{i:02d}"
    return nb


def kernel_spec_dir(parent: Path, env: dict) -> Path:
    """A kernel spec that runs ipykernel with *this* interpreter (nothing registered with Jupyter)."""
    spec = parent / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})", "language": "python", "env": env,
    }))
    return parent


def execute(nb, workdir: Path, quick: bool, timeout: int = 1200):
    """Run every cell of ``nb`` in a fresh kernel of this interpreter, cwd ``workdir``; outputs stored in nb."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    # PYTHONWARNINGS: tqdm.auto's warning that ipywidgets is missing would store this machine's paths in the outputs
    env = {"GLAS_NOTEBOOK_QUICK": "1" if quick else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
           "PYTHONWARNINGS": "ignore:IProgress not found"}
    with tempfile.TemporaryDirectory() as tmp:
        ksm = KernelSpecManager(kernel_dirs=[str(kernel_spec_dir(Path(tmp), env))])
        km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=ksm)
        client = NotebookClient(nb, km=km, timeout=timeout, startup_timeout=180, record_timing=False,
                                resources={"metadata": {"path": str(workdir)}})
        client.execute()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    return nb


def main(argv=None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="only notebooks whose file name contains one of these")
    parser.add_argument("--execute", action="store_true", help="execute and store the outputs")
    parser.add_argument("--quick", action="store_true", help="execute with GLAS_NOTEBOOK_QUICK=1")
    args = parser.parse_args(argv)
    for source in SOURCES:
        if args.names and not any(s in source.name for s in args.names):
            continue
        nb = read_source(source)
        target = source.with_suffix(".ipynb")
        if args.execute:
            t0 = time.perf_counter()
            execute(nb, HERE, args.quick)
            print(f"{target.name}: executed ({'quick' if args.quick else 'full'} mode) in "
                  f"{time.perf_counter() - t0:.0f} s")
        nbformat.validate(nb)
        nbformat.write(nb, target)
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
