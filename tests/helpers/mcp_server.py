"""A small MCP server for tests, built with the same `mcp` SDK the trainer's client uses.

    python tests/helpers/mcp_server.py --port 8765                  # streamable HTTP at /mcp
    python tests/helpers/mcp_server.py --port 8765 --transport sse  # SSE at /sse
    python tests/helpers/mcp_server.py --transport stdio

`McpServerProcess` runs it in a subprocess and waits until it answers an MCP listing (a deadline, no sleeps
as synchronisation); `kill()` ends it at once, as a crashed server would.

Tools: `echo(text)`, `add(a, b)` (integers), `slow(seconds, marker="")` (writes `marker`, if given, when it
starts, so a test knows the call reached the server), `fail(text)` (raises: an isError result) and
`picture()` (an image: non-text content).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
GENEROUS_S = 60.0  # a call's timeout: a loaded CI machine must not turn a working call into a timeout
_PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()


def build_server():
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ImageContent

    server = MCPServer("open-instruct test server")

    @server.tool()
    def echo(text: str) -> str:
        """Repeat the text back."""
        return "echo: " + text

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @server.tool()
    async def slow(seconds: float, marker: str = "") -> str:
        """Wait, then answer."""
        if marker:
            Path(marker).write_text("started")
        await asyncio.sleep(seconds)
        return f"slept {seconds:g}"

    @server.tool()
    def fail(text: str) -> str:
        """Always fails."""
        raise ValueError("refused: " + text)

    @server.tool()
    def picture() -> list:
        """An image."""
        return [ImageContent(type="image", data=_PNG, mime_type="image/png")]

    return server


class McpServerProcess:
    """The test server in a subprocess on 127.0.0.1:`port` (a free one by default)."""

    def __init__(self, port: int | None = None, transport: str = "streamable-http"):
        from helpers.processes import free_port  # here: this file also runs as the server's own script

        self.port = port or free_port()
        self.transport = transport
        path = "/sse" if transport == "sse" else "/mcp"
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> McpServerProcess:
        command = [sys.executable, str(HERE), "--port", str(self.port), "--transport", self.transport]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"the MCP test server exited with code {self.process.returncode}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the MCP test server did not answer within {timeout_s:g} s")
            time.sleep(0.05)  # a poll interval under a deadline, not a synchronisation
        return self

    def _answers(self) -> bool:
        """True once the port accepts and the server lists its tools (the MCP handshake works)."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        from open_instruct.agents.mcp_tools import _run_in_thread, list_server_tools, mcp_config

        config = mcp_config({"server_url": self.url, "transport": "sse" if self.transport == "sse" else "http"})
        try:  # on its own event loop: the caller may be inside one (a test's scripted engine)
            return "echo" in _run_in_thread(lambda: list_server_tools(config), 5.0)
        except Exception:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> McpServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()


def generic_mcp_entry(url: str, **config):
    """The --tools entry of one generic_mcp server at `url` (its --tool_configs JSON: `config` and the URL)."""
    from open_instruct.config.tools import ToolsConfig

    return ToolsConfig(tools=["generic_mcp"], tool_configs=[json.dumps({"server_url": url, **config})])


def stdio_config() -> dict:
    """generic_mcp's --tool_configs for this server over stdio (a process per session)."""
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return {"transport": "stdio", "command": sys.executable, "args": [str(HERE), "--transport", "stdio"], "env": env}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--transport", default="streamable-http", choices=("streamable-http", "sse", "stdio"))
    args = parser.parse_args()
    server = build_server()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run(args.transport, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
