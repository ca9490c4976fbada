"""Uploads, from bytes to a durable ingest job: `detect` tells what the bytes are (from their
content, never their name) and `accept` stores the blob, the document row and its job in one
SQL transaction. The API's upload route and `rag ingest` both come through here. `formats` is
the one list of the file formats, read by `detect` and by the worker's parsing.

Kept light: the parser child imports `formats` and `detect`, so nothing here imports a parsing
library.
"""
