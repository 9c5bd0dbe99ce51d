"""Links to the one upstream MCP server: stdio subprocesses or Streamable HTTP, behind one interface."""
