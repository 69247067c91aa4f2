"""Optional domain code for the studies built on glas-sklearn; not part of the core library.

Nothing in the core package imports from here, and ``import glas_sklearn`` never loads these modules.

- :mod:`glas_sklearn.contrib.smiles`: REINVENT-style SMILES tokenizer, vocabulary and teacher-forcing
  batches for autoregressive sequence models (needs only torch).
- :mod:`glas_sklearn.contrib.chem`: validity and properties of generated SMILES (molecular weight, SlogP,
  SA score) on RDKit. It needs the ``chem`` extra, ``pip install glas-sklearn[chem]``; without RDKit,
  importing it raises an ImportError that says so.
"""

__all__: list[str] = []
