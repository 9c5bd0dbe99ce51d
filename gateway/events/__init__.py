"""Task events: capture rules, the retained log, and the tasks/stream cursor."""
