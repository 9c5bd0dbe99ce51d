"""mcp-task-gateway: a transparent MCP gateway that adds Tasks and resumable task event streams."""

__version__ = "0.1.0"
