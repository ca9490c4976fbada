"""ragserve: private documents in, grounded answers with citations out."""

__version__ = "0.1.0"
