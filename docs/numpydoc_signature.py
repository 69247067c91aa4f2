"""A Sphinx extension of this site: a class's numpydoc Parameters section rendered as its signature says.

The API page shows one entry per parameter, in the order of the class's ``__init__`` signature, each type ending in
the signature's default (``default="mondrian"``), whatever shortcuts the docstring's text takes (two parameters on
one line, ``"random_state : int; verbose : int, default=0"``; a type without its default; the order of a shared
block). It runs on autodoc's raw docstring lines, before numpydoc parses them; the docstrings themselves are not
changed (``help()`` shows them as written). ``tests/test_docs_site.py`` runs it on the estimators.
"""

from __future__ import annotations

import inspect
import re

__all__ = ["parameters_as_signature", "setup"]

_HEADER = re.compile(r"^(\*{0,2}\w+)(?:\s*:\s*(.*))?$")
# A second parameter written on the same header line: "a : T; b : U".
_SPLIT = re.compile(r";\s+(?=\w+\s*:)")


def _signature(obj) -> inspect.Signature | None:
    init = getattr(obj, "__init__", None)
    if init is None or init is object.__init__:
        return None
    try:
        return inspect.signature(init)
    except (TypeError, ValueError):
        return None


def _default_text(value) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _section_bounds(lines: list[str], title: str) -> tuple[int, int] | None:
    """(first line of the entries, end) of the numpydoc section ``title`` in unindented docstring lines."""
    for i in range(len(lines) - 1):
        if lines[i].strip() == title and set(lines[i + 1].strip()) == {"-"} and not lines[i].startswith(" "):
            end = i + 2
            while end < len(lines):
                if (end + 1 < len(lines) and lines[end].strip() and not lines[end].startswith(" ")
                        and lines[end + 1].strip() and set(lines[end + 1].strip()) == {"-"}):
                    break
                end += 1
            return i + 2, end
    return None


def parameters_as_signature(obj, lines: list[str]) -> list[str]:
    """``lines`` (a docstring, as autodoc hands it over) with the Parameters section of class ``obj`` put in the
    order of its ``__init__`` signature, one entry per parameter, each type ending in the signature's default."""
    sig = _signature(obj)
    bounds = _section_bounds(lines, "Parameters")
    if sig is None or bounds is None:
        return lines
    start, end = bounds
    entries: list[tuple[str, str | None, list[str]]] = []  # (name, type, description lines)
    trailing: list[str] = []
    for line in lines[start:end]:
        if line.strip() and not line.startswith(" "):
            for part in _SPLIT.split(line.strip()):
                match = _HEADER.match(part.strip())
                entries.append((match.group(1), match.group(2), []) if match else (part.strip(), None, []))
        elif entries:
            entries[-1][2].append(line)
        else:
            trailing.append(line)
    params = [p for p in sig.parameters.values() if p.name != "self"]
    order = {p.name: i for i, p in enumerate(params)}
    defaults = {p.name: p.default for p in params}
    entries.sort(key=lambda e: order.get(e[0], len(order)))  # stable: unknown names keep their place, last
    out = []
    for name, kind, description in entries:
        default = defaults.get(name, inspect.Parameter.empty)
        if default is not inspect.Parameter.empty and (kind is None or "default" not in kind):
            stated = _default_text(default)
            if kind is None:
                kind = f"default={stated}"
            elif not (default is None and kind.rstrip().endswith("optional")):
                kind = f"{kind}, default={stated}"
        while description and not description[-1].strip():
            description.pop()
        out.append(f"{name} : {kind}" if kind else name)
        out += description
    return lines[:start] + trailing + out + [""] + lines[end:]


def _process(app, what, name, obj, options, lines):
    if what in ("class", "exception"):
        lines[:] = parameters_as_signature(obj, lines)


def setup(app):
    # before numpydoc's own handler (priority 500), which turns the sections into reST
    app.connect("autodoc-process-docstring", _process, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
