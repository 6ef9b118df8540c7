"""The management HTTP API (`/api/v5/...`, EMQX v5's paths and shapes), on the node's HTTP port."""
