"""Agent rollouts: tool calls and environments inside one streamed sample.

`base` holds the shared vocabulary (calls, step results, tool definitions, the `Tool` and `Environment`
Protocols), `parsers` finds calls in model text and formats observations, `tools` and `environments`
answer calls (the hosted search and browse APIs in `web_tools`, MCP servers in `mcp_tools`, the sandbox
environment in `sandbox_env`, all over `http_client`; each registers its own with the decorators of
`open_instruct.extensions`), `rollout` runs the multi-turn loop for one sample inside a generation actor,
and `settings` is the flag group.
"""
