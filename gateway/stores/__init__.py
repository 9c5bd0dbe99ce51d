"""Implementations of the stores' interfaces (`TaskStore`, and next to it the `EventLog`): one module per
kind, each passing the same contract suite. `gateway.app.build_task_store` picks one from `[store] kind`."""
