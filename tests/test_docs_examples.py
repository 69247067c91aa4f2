"""Every Python code block of the README and of the documentation pages runs as written, in order.

A newcomer copies the blocks of one page into a fresh interpreter, one after the other. Here each page's
```` ```python ```` blocks are executed in that order in one fresh namespace (nothing defined by the test or by
another page), in a temporary working directory, so that a block using a name no earlier block of its page
defines, an API that changed, or an example that raises fails here instead of on a user's machine. Shell
commands are ```` ```bash ```` blocks and are not run. A page must leave scikit-learn's global configuration as
it found it (a setting such as metadata routing goes in ``sklearn.config_context``), and the examples show none
of the library's own warnings.

The page on distributed runs is run as ``torchrun --nproc_per_node=1`` would run it: the rendezvous variables
``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE`` are set for one process.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import socket
import sys
import warnings
from pathlib import Path

import pytest
import sklearn

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# The README, then the site's sources (generated pages and the build excluded).
PAGES = [ROOT / "README.md"] + sorted(p for p in DOCS.rglob("*.md")
                                      if not {"generated", "_build", "api"} & set(p.relative_to(DOCS).parts))
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
# Fence infos a page may use: runnable Python, shell commands and plain text that are not run, MyST directives.
_NOT_RUN = {"bash", "text", "console"}


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """``(info, first line of the code, code)`` of every fenced block of a markdown text, in order."""
    return [(m.group(1).strip(), text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in _FENCE.finditer(text)]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    return [(line, code) for info, line, code in fenced_blocks(path.read_text(encoding="utf-8")) if info == "python"]


PAGES_WITH_CODE = [p for p in PAGES if python_blocks(p)]


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _top_level_imports(codes: list[str]) -> set[str]:
    names = set()
    for code in codes:
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_extraction_finds_the_blocks():
    text = "intro\n```bash\nmake demo\n```\n\n```python\nx = 1\n\ny = x\n```\ntext\n```{toctree}\na\n```\n"
    assert fenced_blocks(text) == [("bash", 3, "make demo\n"), ("python", 7, "x = 1\n\ny = x\n"),
                                   ("{toctree}", 13, "a\n")]
    assert len(PAGES_WITH_CODE) >= 8 and ROOT / "README.md" in PAGES_WITH_CODE
    assert DOCS / "getting_started.md" in PAGES_WITH_CODE


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_code_block_is_python_or_not_run(page):
    # a block fenced as ```py, ```python3 or with no language would silently escape the test below
    for info, line, _ in fenced_blocks(page.read_text(encoding="utf-8")):
        assert info == "python" or info in _NOT_RUN or info.startswith("{"), (
            f"{_page_id(page)}:{line}: a code block fenced as {info!r}; use ```python (run by the tests), "
            f"```bash or ```text (not run)")


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_page_id)
def test_page_runs_in_order(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    missing = sorted(name for name in _top_level_imports([code for _, code in blocks])
                     if importlib.util.find_spec(name) is None)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    if "matplotlib" in _top_level_imports([code for _, code in blocks]) or "plotting" in page.read_text():
        pytest.importorskip("matplotlib").use("Agg")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    uses_process_group = any("init_process_group" in code for _, code in blocks)
    if uses_process_group:
        for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0",
                           "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
            monkeypatch.setenv(key, value)
    config = sklearn.get_config()
    namespace = {"__name__": "__main__"}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for line, code in blocks:
                # padded with newlines so that a traceback names the page and its line
                exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)
    finally:
        leaked = {k: v for k, v in sklearn.get_config().items() if config.get(k) != v}
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")
        if uses_process_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        sklearn.set_config(**config)
    assert not leaked, f"{_page_id(page)} changed scikit-learn's global configuration: {leaked}"
    ours = [f"{w.category.__name__}: {w.message}" for w in caught
            if (w.category.__module__ or "").startswith("glas_sklearn")]
    assert not ours, f"{_page_id(page)} shows the library's warnings: {ours}"


def test_pages_leave_global_configuration_alone():
    # checked on every page by test_page_runs_in_order (which restores it after a failure); here the text itself
    offending = [_page_id(p) for p in PAGES_WITH_CODE
                 if any("sklearn.set_config(" in code for _, code in python_blocks(p))]
    assert not offending, f"use sklearn.config_context(...) in examples, not set_config: {offending}"
