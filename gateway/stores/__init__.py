"""Implementations of the stores' interfaces (`TaskStore`, and next to it the `EventLog`): one module per
kind, each passing the same contract suite. `gateway.app.build_stores` picks one from `[store] kind`."""

SECRET_BYTES = 32
"""The size of a secret a store draws for the gateway (`secret`): the principals' key."""
