"""The job: its file (config), the task registry, text specs and templates, and the plan (shards → chunks,
and the fingerprint that decides whether a folder's chunks can be reused)."""
