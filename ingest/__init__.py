"""The ingest worker: claim a job, parse, chunk, embed, write."""
