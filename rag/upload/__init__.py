"""Uploads, from bytes to a durable ingest job: `detect` tells what the bytes are (from their
content, never their name) and `accept` stores the blob, the document row and its job in one
SQL transaction. The API's upload route and `rag ingest` both come through here.

Kept light: the parser child imports `detect` for its media-type names.
"""
