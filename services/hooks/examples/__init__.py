"""Example plugins, installed as entry points of `weir.plugins` (pyproject.toml):
`topic_rewrite` and `webhook`. docs/plugins.md shows how to write one."""
