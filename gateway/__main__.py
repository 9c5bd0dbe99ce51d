"""`python -m gateway` is the `mcp-task-gateway` command."""

from gateway.cli import main

raise SystemExit(main())
