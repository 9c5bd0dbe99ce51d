"""What the task events say about requests, answers and outcomes: their shape, never their content.

An input event names the request's method and shape (an elicitation's fields, a sampling request's
message count), an answer event its action or outcome, a terminal event its outcome's content types
and sizes, `task.created` who created the task and a digest of its arguments. Large payloads and the
values a user typed stay out of the log. Pure functions; no I/O.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message

SUMMARY_TEXT_CHARS = 200
"""Request texts (an elicitation's message) are cut to this many characters in input events."""
DIGEST_HEX_DIGITS = 32
"""The arguments' sha256 in `task.created` is cut to its first 128 bits: plenty to match a known call."""


def canonical_json(value: object) -> bytes:
    """JSON with object keys sorted at every level, no whitespace, UTF-8: one byte string per value."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def call_audit(owner: str, arguments: object) -> dict[str, str]:
    """The audit fields of `task.created`: the creator's principal hash, and the start of the sha256 of
    the canonical JSON of the call's arguments (absent arguments are `{}`), never the arguments."""
    digest = hashlib.sha256(canonical_json({} if arguments is None else arguments)).hexdigest()
    return {"principal": owner, "argumentsSha256": digest[:DIGEST_HEX_DIGITS]}


def method_of(request: object) -> str | None:
    method = request.get("method") if isinstance(request, dict) else None
    return method if isinstance(method, str) else None


def summarize_request(request: object) -> dict[str, Any]:
    """What an input event says about a request besides its method: its shape, never a large payload."""
    params = jsonrpc.params_of(request) if isinstance(request, dict) else {}
    summary: dict[str, Any] = {}
    method = method_of(request)
    if method == "elicitation/create":
        summary["mode"] = params.get("mode", "form")
        if isinstance(params.get("message"), str):
            summary["message"] = params["message"][:SUMMARY_TEXT_CHARS]
        schema = params.get("requestedSchema")
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(properties, dict):
            summary["fields"] = list(properties)
        if isinstance(params.get("url"), str):
            summary["url"] = params["url"][:SUMMARY_TEXT_CHARS]
    elif method == "sampling/createMessage":
        messages = params.get("messages")
        summary["messages"] = len(messages) if isinstance(messages, list) else 0
        if "maxTokens" in params:
            summary["maxTokens"] = params["maxTokens"]
    else:
        summary["params"] = sorted(key for key in params if key != "_meta")
    return summary


def summarize_answer(answer: Message) -> dict[str, Any]:
    """What an input event says about an answer (a JSON-RPC response, or a modern input response):
    the action or outcome, never the content's values."""
    error = answer.get("error")
    if isinstance(error, dict):
        return {"error": {"code": error.get("code"), "message": error.get("message")}}
    result = answer.get("result", answer)
    if not isinstance(result, dict):
        return {}
    summary: dict[str, Any] = {}
    if isinstance(result.get("action"), str):
        summary["action"] = result["action"]
        if isinstance(result.get("content"), dict):
            summary["fields"] = sorted(result["content"])
    for key in ("model", "stopReason"):
        if isinstance(result.get(key), str):
            summary[key] = result[key]
    if not summary:
        summary["keys"] = sorted(key for key in result if key != "_meta")
    return summary


def summarize_outcome(status: str, outcome: Message | None) -> dict[str, Any]:
    """The terminal event's payload: the outcome's shape, not its (possibly large) content."""
    summary: dict[str, Any] = {"status": status}
    if outcome is None:
        return summary
    error = outcome.get("error")
    if isinstance(error, dict):
        summary["error"] = {"code": error.get("code"), "message": error.get("message")}
        return summary
    result = outcome.get("result")
    if isinstance(result, dict):
        summary["isError"] = bool(result.get("isError", False))
        content = result.get("content")
        if isinstance(content, list):
            summary["content"] = [
                {"type": block.get("type"), "bytes": len(str(block.get("text", block.get("data", ""))))}
                for block in content
                if isinstance(block, dict)
            ]
        if "structuredContent" in result:
            summary["structuredContent"] = True
    return summary
