"""The state the event log folds into: the reference fold (`view`), the state
store's records and keys (`store`, `redis`, `records`), live nodes' dumps
(`live`) and the drift check (`drift`)."""
