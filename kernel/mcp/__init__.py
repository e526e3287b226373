"""`regent mcp`: an MCP gateway that records every upstream tool call as a `tool_call` step."""
