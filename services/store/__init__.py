"""What the session and queue stores share, and what the cluster's links send:
the store errors, the Redis plumbing (client, bounded calls, scripts, a
client's hash-tagged keys), the per-client memory records, and the compact
message format. Below the services that use it (docs/architecture.md 1)."""
