"""The SEP-2694 conformance kit: a black-box check of any Streamable HTTP MCP server or gateway that
claims `tasks/stream`, run by `mcp-task-gateway conformance URL`.

`registry` lists the checks (stable ids, the SEP sentence each one checks), `probe` talks JSON-RPC
over HTTP and keeps every exchange as evidence, `checks` runs the scenarios and judges them, `report`
writes the table, JUnit and JSON, and `docs` generates the check reference in docs/conformance.md.
"""
