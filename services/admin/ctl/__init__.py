"""`weir ctl`: the management HTTP API (services/api) from the command line."""
