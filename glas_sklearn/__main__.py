"""``python -m glas_sklearn``: the command-line interface."""

from .cli import main

raise SystemExit(main())
