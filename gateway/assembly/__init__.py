"""The gateway's parts, built feature by feature for `gateway.app.build_app`.

One module per feature; each builder constructs its feature's parts, adds its routes, and registers
its own start and stop as an aiohttp cleanup context (started in the order the builders are called,
stopped in reverse). `build_app` calls them in this order, which is the start-up order:

- `metrics`: the `Metrics`, the configured ceilings, and /metrics (on its own listener, first of all);
- `stores`: the task store and event log `[store] kind` names (opened first, closed last);
- `auth`: client authentication (`EdgeAuth`, the OAuth token validator) and the principal key;
- `upstream`: the upstream link and the budget of bytes buffered for clients (`routes`: which endpoints,
  each of several upstreams' link and sessions started and stopped in a group of its own, `parts`);
- `sessions`: the legacy client sessions;
- `tasks`: the task registry, hosted and pass-through tasks, owner leases and the task service;
- `edge`: the MCP endpoint, the HTTP request context, the connection count;
- `health`: readiness, the store's health, /healthz and /readyz (serving once everything has started);
- `ui`: the task timeline page at /ui, its static files and /ui/config.json (`[ui]`; no start or stop).

Then, when the gateway was started from a config file, `reload` wires what a config reload applies to
these parts (SIGHUP, `POST /admin/reload`); with several upstreams `servers` starts an added upstream's
parts with the same builders and stops a removed one's once it has drained.
"""
