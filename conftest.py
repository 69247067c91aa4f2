"""Doctest collection: skip modules whose optional dependency is not installed."""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("rdkit") is None:
    collect_ignore.append("glas_sklearn/contrib/chem.py")
if importlib.util.find_spec("matplotlib") is None:
    collect_ignore.append("glas_sklearn/plotting")
