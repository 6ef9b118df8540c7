"""The state store: the Spark job's projection of the event log, as the node reads it."""
