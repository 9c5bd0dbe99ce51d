"""Tasks: the registry of every task the gateway knows, and gateway-hosted tasks for upstreams without."""
