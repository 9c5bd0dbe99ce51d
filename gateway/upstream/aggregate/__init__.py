"""The aggregate upstream: one MCP server made of every configured upstream (served at `/mcp`)."""
