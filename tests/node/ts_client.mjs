// An MCP host as the TypeScript SDK's own client is one: it starts a server command over
// stdio, lists the tools (which is when the SDK learns each tool's outputSchema and from then
// on checks structuredContent against it), then makes the calls it is given, in order.
//
//   node ts_client.mjs '{"command": [...], "calls": [{"name": ..., "arguments": {...}}]}'
//
// Prints one JSON line per call: {"result": <the CallToolResult>} when the SDK handed the
// result to the host, {"error": <message>} when the SDK rejected it instead. Exits 0 once
// every call has an answer; the caller judges them.
//
// Client and transport: https://github.com/modelcontextprotocol/typescript-sdk (v1.x,
// src/client/index.ts callTool: "Only validate structured content if present").
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const spec = JSON.parse(process.argv[2]);
const [command, ...args] = spec.command;
// The whole environment (the SDK passes only a few variables by default): the proxy and
// the server it starts need PATH, PYTHONPATH and the rest as the test set them.
const transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: "inherit" });
const client = new Client({ name: "intentlog-ts-host", version: "1.0.0" });
await client.connect(transport);
await client.listTools();
for (const call of spec.calls) {
  try {
    const result = await client.callTool({ name: call.name, arguments: call.arguments ?? {} });
    console.log(JSON.stringify({ result }));
  } catch (error) {
    console.log(JSON.stringify({ error: String(error?.message ?? error) }));
  }
}
await client.close();
