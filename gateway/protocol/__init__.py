"""The MCP wire protocol as the gateway needs it: message kinds, errors, eras. No I/O here."""
