"""The package version, in one place below everything that records it (the pickles, the package namespace)."""

__version__ = "0.1.0.dev0"
