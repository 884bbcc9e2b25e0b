"""The MCP conformance suite's reference server, written with the Python MCP SDK: the tools,
resources and prompts the suite's server scenarios call, by the names and with the answers
they check.

    python tests/support/mcp_everything_server.py [--http HOST:PORT --ready-file F]

Over stdio by default (for ``intentlog mcp -- CMD``); with ``--http``, streamable HTTP at
``http://HOST:PORT/mcp`` (port 0: any free one), the URL written atomically to the ready
file once the server accepts connections.

The names and answers follow the suite's description of its reference server
(https://github.com/modelcontextprotocol/conformance, ``examples/servers``); a scenario this
server does not serve fails bare, and the conformance test compares the proxy only on the
scenarios the bare server passes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import socket
import sys
from pathlib import Path
from typing import Any

import mcp_types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from pydantic import BaseModel, Field

# A 1x1 PNG and a minimal WAV, as the suite expects them back.
IMAGE = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8"
    "DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="


JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


class _Reply(BaseModel):
    response: str = Field(description="User's response")


class _Defaults(BaseModel):
    """SEP-1034: a default for every primitive type."""

    name: str = Field(default="John Doe", description="User name")
    age: int = Field(default=30, description="User age")
    score: float = Field(default=95.5, description="User score")
    status: str = Field(
        default="active",
        description="User status",
        json_schema_extra={"enum": ["active", "inactive", "pending"]},
    )
    verified: bool = Field(default=True, description="Verification status")


class _Enums(BaseModel):
    """SEP-1330: the enum shapes of an elicitation schema."""

    untitledSingle: str = Field(
        description="Simple enum", json_schema_extra={"enum": ["option1", "option2", "option3"]}
    )
    titledSingle: str = Field(
        description="Titled enum",
        json_schema_extra={
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ]
        },
    )
    legacyEnum: str = Field(
        description="Legacy enum",
        json_schema_extra={
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
    )
    untitledMulti: list[str] = Field(
        description="Multi-select",
        json_schema_extra={
            "minItems": 1,
            "maxItems": 3,
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
    )
    titledMulti: list[str] = Field(
        description="Titled multi-select",
        json_schema_extra={
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    )


def build() -> MCPServer[Any]:
    """The server, with every tool, resource and prompt registered."""
    app: MCPServer[Any] = MCPServer("mcp-conformance-test-server", version="1.0.0")

    @app.tool(description="Tests simple text content response")
    def test_simple_text() -> str:
        return "This is a simple text response for testing."

    @app.tool(description="Tests image content response")
    def test_image_content() -> list[mcp_types.ImageContent]:
        return [mcp_types.ImageContent(type="image", data=IMAGE, mime_type="image/png")]

    @app.tool(description="Tests audio content response")
    def test_audio_content() -> list[mcp_types.AudioContent]:
        return [mcp_types.AudioContent(type="audio", data=AUDIO, mime_type="audio/wav")]

    def resource(uri: str, mime: str, text: str) -> mcp_types.EmbeddedResource:
        contents = mcp_types.TextResourceContents(uri=uri, mime_type=mime, text=text)
        return mcp_types.EmbeddedResource(type="resource", resource=contents)

    @app.tool(description="Tests embedded resource content response")
    def test_embedded_resource() -> list[mcp_types.EmbeddedResource]:
        return [
            resource(
                "test://embedded-resource", "text/plain", "This is an embedded resource content."
            )
        ]

    @app.tool(description="Tests response with multiple content types (text, image, resource)")
    def test_multiple_content_types() -> list[
        mcp_types.TextContent | mcp_types.ImageContent | mcp_types.EmbeddedResource
    ]:
        return [
            mcp_types.TextContent(type="text", text="Multiple content types test:"),
            mcp_types.ImageContent(type="image", data=IMAGE, mime_type="image/png"),
            resource(
                "test://mixed-content-resource",
                "application/json",
                json.dumps({"test": "data", "value": 123}),
            ),
        ]

    @app.tool(description="Tests tool that emits log messages during execution")
    async def test_tool_with_logging(ctx: Context) -> str:
        for text in ("Tool execution started", "Tool processing data", "Tool execution completed"):
            await ctx.info(text)
            await asyncio.sleep(0.05)
        return "Tool with logging executed successfully"

    @app.tool(description="Tests tool that reports progress notifications")
    async def test_tool_with_progress(ctx: Context) -> str:
        for step in (0, 50, 100):
            await ctx.report_progress(step, 100, f"Completed step {step} of 100")
            await asyncio.sleep(0.05)
        meta = ctx.request_context.meta
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if token is None:
            token = getattr(meta, "progress_token", None)
        return str(token if token is not None else 0)

    @app.tool(description="Tests error response handling")
    def test_error_handling() -> str:
        raise RuntimeError("This tool intentionally returns an error for testing")

    @app.tool(description="Tests server-initiated sampling (LLM completion request)")
    async def test_sampling(prompt: str, ctx: Context) -> str:
        message = mcp_types.SamplingMessage(
            role="user", content=mcp_types.TextContent(type="text", text=prompt)
        )
        result = await ctx.session.create_message(messages=[message], max_tokens=100)
        content = result.content
        text = content.text if isinstance(content, mcp_types.TextContent) else "No response"
        return f"LLM response: {text}"

    @app.tool(description="Tests server-initiated elicitation (user input request)")
    async def test_elicitation(message: str, ctx: Context) -> str:
        result = await ctx.elicit(message=message, schema=_Reply)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"User response: action={result.action}, content={content}"

    @app.tool(description="Tests elicitation with default values per SEP-1034")
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        result = await ctx.elicit(
            message="Please review and update the form fields with defaults", schema=_Defaults
        )
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"Elicitation completed: action={result.action}, content={content}"

    @app.tool(description="Tests elicitation with enum schema variations per SEP-1330")
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        result = await ctx.elicit(
            message="Please select options from the enum fields", schema=_Enums
        )
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"Elicitation completed: action={result.action}, content={content}"

    @app.tool(description="Tool with JSON Schema 2020-12 features")
    def json_schema_2020_12_tool(name: str = "", address: dict[str, Any] | None = None) -> str:
        return f"received {name!r}"

    # Its listed inputSchema as the suite gives it, keywords a proxy must not strip (SEP-1613,
    # SEP-2106); the SDK would derive a plainer one from the signature.
    app._tool_manager.get_tool("json_schema_2020_12_tool").parameters = JSON_SCHEMA_2020_12

    # 2026-07-28 multi-round tools (SEP-2322): the first round answers input_required with
    # the requests the client must fulfil; the retry carries inputResponses (and requestState).
    def ask(**requests: mcp_types.InputRequest) -> mcp_types.InputRequiredResult:
        return mcp_types.InputRequiredResult(input_requests=requests)

    def form(message: str, field: str) -> mcp_types.ElicitRequest:
        schema = {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}
        params = mcp_types.ElicitRequestFormParams(message=message, requested_schema=schema)
        return mcp_types.ElicitRequest(params=params)

    def answered(ctx: Context, key: str) -> bool:
        return key in (ctx.input_responses or {})

    @app.tool(description="Tests an input_required result asking for an elicitation")
    def test_input_required_result_elicitation(
        ctx: Context,
    ) -> str | mcp_types.InputRequiredResult:
        if not answered(ctx, "user_name"):
            return ask(user_name=form("What is your name?", "name"))
        return "Hello, the name was received."

    @app.tool(description="Tests an input_required result asking for a sampling")
    def test_input_required_result_sampling(ctx: Context) -> str | mcp_types.InputRequiredResult:
        if not answered(ctx, "capital"):
            text = mcp_types.TextContent(type="text", text="What is the capital of France?")
            message = mcp_types.SamplingMessage(role="user", content=text)
            params = mcp_types.CreateMessageRequestParams(messages=[message], max_tokens=100)
            return ask(capital=mcp_types.CreateMessageRequest(params=params))
        return "The model answered."

    @app.tool(description="Tests an input_required result asking for the client's roots")
    def test_input_required_result_list_roots(
        ctx: Context,
    ) -> str | mcp_types.InputRequiredResult:
        if not answered(ctx, "roots"):
            return ask(roots=mcp_types.ListRootsRequest())
        return "The roots were received."

    @app.tool(description="Tests an input_required result carrying requestState")
    def test_input_required_result_request_state(
        ctx: Context,
    ) -> str | mcp_types.InputRequiredResult:
        if ctx.request_state != "round-1" or not answered(ctx, "confirm"):
            return mcp_types.InputRequiredResult(
                input_requests={"confirm": form("Confirm?", "ok")}, request_state="round-1"
            )
        return "Confirmed with the echoed state."

    @app.tool(description="Tests a tool that needs three rounds")
    def test_input_required_result_multi_round(
        ctx: Context,
    ) -> str | mcp_types.InputRequiredResult:
        if ctx.request_state == "round-2" and answered(ctx, "color"):
            return "Both answers received."
        if ctx.request_state == "round-1" and answered(ctx, "name"):
            return mcp_types.InputRequiredResult(
                input_requests={"color": form("Favourite color?", "color")},
                request_state="round-2",
            )
        return mcp_types.InputRequiredResult(
            input_requests={"name": form("Your name?", "name")}, request_state="round-1"
        )

    @app.resource("test://static-text", mime_type="text/plain")
    def static_text() -> str:
        """A static text resource for testing"""
        return "This is the content of the static text resource."

    @app.resource("test://static-binary", mime_type="image/png")
    def static_binary() -> bytes:
        """A static binary resource (image) for testing"""
        return base64.b64decode(IMAGE)

    @app.resource("test://template/{id}/data", mime_type="application/json")
    def template(id: str) -> str:
        """A resource template with parameter substitution"""
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @app.resource("test://watched-resource", mime_type="text/plain")
    def watched() -> str:
        """A resource that can be subscribed to for updates"""
        return "Watched resource content"

    @app.prompt(description="A simple prompt without arguments")
    def test_simple_prompt() -> list[UserMessage]:
        return [UserMessage("This is a simple prompt for testing.")]

    @app.prompt(description="A prompt with required arguments")
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        return [UserMessage(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]

    @app.prompt(description="A prompt that includes an embedded resource")
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        embedded = resource(resourceUri, "text/plain", "Embedded resource content for testing.")
        return [UserMessage(embedded), UserMessage("Please process the embedded resource above.")]

    @app.prompt(description="A prompt that includes image content")
    def test_prompt_with_image() -> list[UserMessage]:
        image = mcp_types.ImageContent(type="image", data=IMAGE, mime_type="image/png")
        return [UserMessage(image), UserMessage("Please analyze the image above.")]

    @app.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> mcp_types.Completion:
        return mcp_types.Completion(values=[], total=0, has_more=False)

    lowlevel = app._lowlevel_server

    async def empty(ctx: Any, params: Any) -> mcp_types.EmptyResult:
        return mcp_types.EmptyResult()

    lowlevel.add_request_handler("logging/setLevel", mcp_types.SetLevelRequestParams, empty)
    lowlevel.add_request_handler("resources/subscribe", mcp_types.SubscribeRequestParams, empty)
    lowlevel.add_request_handler("resources/unsubscribe", mcp_types.UnsubscribeRequestParams, empty)
    return app


async def _serve_http(app: MCPServer[Any], host: str, port: int, ready_file: str | None) -> int:
    import uvicorn

    # Bound here, so port 0 is known before the server starts and the URL names the real port.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app.streamable_http_app(host=host),
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
    )
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if not server.started:
        await task
        return 1
    if ready_file:
        ready = Path(ready_file)
        partial = ready.with_name(ready.name + ".partial")
        partial.write_text(f"http://{host}:{bound}/mcp")
        partial.replace(ready)
    await task
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", default=None, help="HOST:PORT (port 0: any free one)")
    parser.add_argument("--ready-file", default=None, help="HTTP: where the URL is written")
    args = parser.parse_args(argv)
    app = build()
    if args.http is None:
        app.run()
        return 0
    host, _, port = args.http.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve_http(app, host, int(port), args.ready_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
