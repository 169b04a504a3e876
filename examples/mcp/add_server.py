"""An MCP server offering ``add``, the function the demo-tools model was taught: the SDK's own
``MCPServer`` (what was FastMCP).

    python examples/mcp/add_server.py                 # stdio (examples/mcp/add.json starts it so)
    python examples/mcp/add_server.py --http 8765     # Streamable HTTP on http://127.0.0.1:8765/mcp
    python examples/mcp/add_server.py --sse 8765      # the older HTTP+SSE transport on http://127.0.0.1:8765/sse
"""

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("math", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers and return their sum.

    Args:
        a: the first number
        b: the second number
    """
    print(f"add({a}, {b}) = {a + b}", file=sys.stderr, flush=True)  # stderr: the client's log, never its answers
    return a + b


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif sys.argv[1:2] == ["--sse"]:
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
