"""Every Python code block of the README and of the documentation pages runs as written, in order, and every output
they show is what they print.

A newcomer copies the blocks of one page into a fresh interpreter, one after the other. Here each page's
```` ```python ```` blocks are executed in that order in one fresh namespace (nothing defined by the test or by
another page), in a temporary working directory, so that a block using a name no earlier block of its page
defines, an API that changed, or an example that raises fails here instead of on a user's machine. Shell
commands are ```` ```bash ```` blocks and are not run. A page must leave scikit-learn's global configuration as
it found it (a setting such as metadata routing goes in ``sklearn.config_context``), and the examples show none
of the library's own warnings.

Scripts a page includes (```` ```{literalinclude} path.py ````) run as files: under
``torchrun --nproc_per_node=2`` (CPU, gloo) when they start a process group, else with ``python``.

Shown output. A ```` ```text ```` block right after a Python block or an included script (prose between them, no
other code block) is that code's output, and must be what it gives here. What it prints is compared line by line:
the same words, and with one torch thread (the tests' default) numbers within 10 % (times in seconds and numbers in
e-notation, which vary from machine to machine, are not compared). For code that prints nothing, the progress
report ``verbose=1`` writes (to stderr) is compared by its structure: the same steps, one line each, in the same
order (the progress-bar updates of a long stage left out).

A block that needs a package outside the core dependencies says so on its page; a package of the ``test`` extra
(which CI installs) must be there, any other one skips the page.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import pytest
import sklearn
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# The README, then the site's sources (generated pages and the build excluded).
PAGES = [ROOT / "README.md"] + sorted(p for p in DOCS.rglob("*.md")
                                      if not {"generated", "_build", "api"} & set(p.relative_to(DOCS).parts))
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
# Fence infos a page may use: runnable Python, shell commands and plain text that are not run, MyST directives.
_NOT_RUN = {"bash", "text", "console"}
# Import name -> distribution for the packages of the test extra whose import name differs.
_IMPORT_NAMES = {"scikit-learn": "sklearn"}


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """``(info, first line of the code, code)`` of every fenced block of a markdown text, in order."""
    return [(m.group(1).strip(), text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in _FENCE.finditer(text)]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    return [(line, code) for info, line, code in fenced_blocks(path.read_text(encoding="utf-8")) if info == "python"]


def _included_script(info: str, code: str, page: Path) -> Path | None:
    if info.startswith("{literalinclude}") and info.split(None, 1)[1].strip().endswith(".py"):
        return (page.parent / info.split(None, 1)[1].strip()).resolve()
    return None


def shown_outputs(path: Path) -> dict[int, str]:
    """Index of a code block (among the page's fenced blocks) -> the text block that shows its output."""
    blocks = fenced_blocks(path.read_text(encoding="utf-8"))
    return {i - 1: code for i, (info, _, code) in enumerate(blocks)
            if info == "text" and i > 0 and (blocks[i - 1][0] == "python"
                                              or _included_script(blocks[i - 1][0], blocks[i - 1][2], path))}


def included_scripts(path: Path) -> list[tuple[Path, str | None]]:
    """The Python files a page includes, each with the output the page shows for it (or None)."""
    blocks, outputs = fenced_blocks(path.read_text(encoding="utf-8")), shown_outputs(path)
    return [(script, outputs.get(i)) for i, (info, _, code) in enumerate(blocks)
            if (script := _included_script(info, code, path)) is not None]


PAGES_WITH_CODE = [p for p in PAGES if python_blocks(p)]
SCRIPTS = [(page, script, output) for page in PAGES for script, output in included_scripts(page)]


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


def _test_extra() -> set[str]:
    """Import names of the packages of the ``test`` extra (CI installs them)."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # tomllib is Python ≥ 3.11
    specs = re.findall(r'"([^"]+)"', re.search(r"^test = \[(.*?)\]", pyproject, re.S | re.M).group(1))
    names = {re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0] for spec in specs}
    return {_IMPORT_NAMES.get(name, name.replace("-", "_")) for name in names}


def _require(imports: set[str], page: Path) -> None:
    missing = sorted(name for name in imports if importlib.util.find_spec(name) is None)
    required = sorted(set(missing) & _test_extra())
    assert not required, (f"{_page_id(page)} needs {', '.join(required)}, of the test extra: "
                          f"pip install -e '.[test]'")
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _tokens(line: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The words of a line (numbers replaced by #) and each number with the text that follows it."""
    words = _NUMBER.sub("#", " ".join(line.split()))
    numbers = [(m.group(0), line[m.end():m.end() + 2]) for m in _NUMBER.finditer(line)]
    return words.split(), numbers


def output_mismatches(shown: str, real: str, rel: float = 0.1, compare_numbers: bool | None = None) -> list[str]:
    """Where ``real`` output differs from the ``shown`` one: lines, words, or a number by more than ``rel``
    (plus two units of the last digit shown; only with one torch thread, the thread count the docs' outputs were
    made with); times in seconds and e-notation are not compared."""
    if compare_numbers is None:
        compare_numbers = torch.get_num_threads() == 1
    shown_lines = [line for line in shown.splitlines() if line.strip()]
    real_lines = [line for line in real.splitlines() if line.strip()]
    if len(shown_lines) != len(real_lines):
        return [f"{len(shown_lines)} lines shown, {len(real_lines)} printed:\n{real}"]
    problems = []
    for a, b in zip(shown_lines, real_lines, strict=True):
        (words_a, numbers_a), (words_b, numbers_b) = _tokens(a), _tokens(b)
        if words_a != words_b or len(numbers_a) != len(numbers_b):
            problems.append(f"shown {a!r}, printed {b!r}")
            continue
        for (x, after), (y, _) in zip(numbers_a, numbers_b, strict=True):
            if not compare_numbers or after.startswith((" s", "s")) and not after.startswith("s)") or "e" in x.lower():
                continue
            u, v = float(x.replace(",", "")), float(y.replace(",", ""))
            unit = 10.0 ** -len(x.split(".")[1]) if "." in x else 1.0
            if abs(u - v) > rel * max(abs(u), abs(v)) + 2 * unit:
                problems.append(f"shown {a!r}, printed {b!r} ({x} against {y})")
    return problems


_PROGRESS_BAR = re.compile(r"\d+/\d+ .*\[\d+:\d+")


def report_mismatches(shown: str, real: str) -> list[str]:
    """Where a real progress report differs in structure from the ``shown`` one: the step each line reports (its
    text before the first ':'), line by line; progress-bar updates of a long stage are left out."""
    def steps(text):
        return [line.split(":")[0].strip() for line in text.splitlines()
                if line.strip() and not _PROGRESS_BAR.search(line)]

    if steps(shown) != steps(real):
        return [f"steps shown {steps(shown)}, reported {steps(real)}:\n{real}"]
    return []


def test_the_extraction_finds_the_blocks():
    text = "intro\n```bash\nmake demo\n```\n\n```python\nx = 1\n\ny = x\n```\ntext\n```{toctree}\na\n```\n"
    assert fenced_blocks(text) == [("bash", 3, "make demo\n"), ("python", 7, "x = 1\n\ny = x\n"),
                                   ("{toctree}", 13, "a\n")]
    assert len(PAGES_WITH_CODE) >= 8 and ROOT / "README.md" in PAGES_WITH_CODE
    assert DOCS / "getting_started.md" in PAGES_WITH_CODE
    assert shown_outputs(ROOT / "README.md"), "the README shows what its example prints"
    assert any(script.name == "distributed_fit.py" and output for _, script, output in SCRIPTS)


def test_output_comparison():
    shown = "fitted in 49.2 s: 500 epochs, coverage [0.558 0.857], residual 6.4e-06\n"

    def differs(real):
        return output_mismatches(shown, real, compare_numbers=True)

    assert differs("fitted in 12.0 s: 500 epochs, coverage [0.56 0.853], residual 1e-07\n") == []
    assert differs("fitted in 12.0 s: 300 epochs, coverage [0.56 0.853], residual 1e-07\n")
    assert differs("fitted in 12.0 s: 500 epochs, coverage [0.56 0.6], residual 1e-07\n")
    assert differs("fitted in 12.0 s: 500 epochs, width [0.56 0.853], residual 1e-07\n")
    assert differs(shown + "one more line\n")
    log = "training: 383 epochs, 22.4 s\nposterior: low_rank, d = 50\n"
    assert report_mismatches(log, "training: 12/500 it [00:30<00:35]\ntraining: 300 epochs\nposterior: d = 9\n") == []
    assert report_mismatches(log, "training: 300 epochs\nlanczos: 50 eigenpairs\nposterior: d = 9\n")


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
    _require(_top_level_imports([code for _, code in blocks]), page)
    assert not any("init_process_group" in code for _, code in blocks), (
        f"{_page_id(page)}: code that starts a process group goes in a script the page includes (literalinclude), "
        "which this test runs under torchrun")
    if "matplotlib" in _top_level_imports([code for _, code in blocks]) or "plotting" in page.read_text():
        pytest.importorskip("matplotlib").use("Agg")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    text = page.read_text(encoding="utf-8")
    all_blocks = fenced_blocks(text)
    outputs = shown_outputs(page)
    config = sklearn.get_config()
    namespace = {"__name__": "__main__"}
    mismatches = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for index, (info, line, code) in enumerate(all_blocks):
                if info != "python":
                    continue
                printed, reported = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(reported):
                    # padded with newlines so that a traceback names the page and its line
                    exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)
                if index in outputs:
                    found = (output_mismatches(outputs[index], printed.getvalue()) if printed.getvalue()
                             else report_mismatches(outputs[index], reported.getvalue()))
                    mismatches += [f"{_page_id(page)}:{line}: {m}" for m in found]
    finally:
        leaked = {k: v for k, v in sklearn.get_config().items() if config.get(k) != v}
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")
        sklearn.set_config(**config)
    assert not leaked, f"{_page_id(page)} changed scikit-learn's global configuration: {leaked}"
    ours = [f"{w.category.__name__}: {w.message}" for w in caught
            if (w.category.__module__ or "").startswith("glas_sklearn")]
    assert not ours, f"{_page_id(page)} shows the library's warnings: {ours}"
    assert not mismatches, "the output a page shows is not what its code prints:\n" + "\n".join(mismatches)


@pytest.mark.parametrize("page, script, output", SCRIPTS, ids=[f"{_page_id(p)}:{s.name}" for p, s, _ in SCRIPTS])
def test_included_script_runs(page, script, output, tmp_path):
    assert script.is_file(), f"{_page_id(page)} includes {script}, which is not there"
    source = script.read_text(encoding="utf-8")
    _require(_top_level_imports([source]), page)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    if "init_process_group" in source:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    else:
        command = [sys.executable, str(script)]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(command[1:])} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    if output is not None:
        problems = output_mismatches(output, proc.stdout)
        assert not problems, f"{_page_id(page)} shows another output for {script.name}:\n" + "\n".join(problems)


def test_pages_leave_global_configuration_alone():
    # checked on every page by test_page_runs_in_order (which restores it after a failure); here the text itself
    offending = [_page_id(p) for p in PAGES_WITH_CODE
                 if any("sklearn.set_config(" in code for _, code in python_blocks(p))]
    assert not offending, f"use sklearn.config_context(...) in examples, not set_config: {offending}"


# ------------------------------------------------------------------------------ pasted into the interpreter
#: The pages a newcomer pastes from: their blocks must also run typed into ``python`` line by line, where a blank
#: line ends a compound statement and a statement right after an indented block without one is a SyntaxError.
PASTED_PAGES = [ROOT / "README.md", DOCS / "getting_started.md"]


class _Console:
    """``code.InteractiveConsole`` fed one line at a time, recording what it would print as an error."""

    def __init__(self, namespace: dict):
        import code

        errors = self.errors = []

        class Console(code.InteractiveConsole):
            def showsyntaxerror(self, filename=None, **kwargs):
                errors.append("SyntaxError: " + "".join(traceback.format_exception_only(*sys.exc_info()[:2])))

            def showtraceback(self):
                errors.append("".join(traceback.format_exception(*sys.exc_info())[-3:]))

        self.console = Console(locals=namespace)

    def paste(self, code: str) -> None:
        for line in code.splitlines():
            self.console.push(line)
        self.console.push("")  # the Enter after the paste, which ends a trailing compound statement


def test_the_console_sees_what_a_script_does_not():
    console = _Console({})
    console.paste("total = 0\nfor k in range(3):\n    total += k\nprint(total)\n")
    assert console.errors and console.errors[0].startswith("SyntaxError")
    console = _Console({})
    console.paste("total = 0\nfor k in range(3):\n    total += k\n\nassert total == 3\n")
    assert console.errors == []


@pytest.mark.parametrize("page", PASTED_PAGES, ids=_page_id)
def test_page_pastes_into_the_interpreter(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    _require(_top_level_imports([code for _, code in blocks]), page)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    config = sklearn.get_config()
    console = _Console({"__name__": "__console__"})
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            for line, code in blocks:
                before = len(console.errors)
                console.paste(code)
                console.errors[before:] = [f"{_page_id(page)}:{line}: {e}" for e in console.errors[before:]]
    finally:
        sklearn.set_config(**config)
    assert not console.errors, "pasted into python, a block fails:\n" + "\n".join(console.errors)
