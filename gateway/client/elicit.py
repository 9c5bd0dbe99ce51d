"""Answering a server's questions from the shell: form elicitation (`elicitation/create`, mode `form`).

`Answerer` is the CLI's `on_input` (`stream.OnInput`): the same answer serves a 2025-11-25 server
request and a 2026-07-28 input request. The answer's fields come from `--answers JSON` (an object of
field values; each question takes the fields it asks for), then, on a terminal, from a prompt on
stderr for each field still open. Without a terminal, a question whose required fields `--answers`
does not cover is answered `cancel`, with a notice naming them. Other requests (sampling, roots, URL
elicitation) are refused: this client declares form elicitation only (`CAPABILITIES`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import orjson

from gateway.client.stream import JsonRpcError, Message
from gateway.client.tail import UsageError
from gateway.protocol.jsonrpc import METHOD_NOT_FOUND

CAPABILITIES: dict[str, Any] = {"elicitation": {"form": {}}}
"""The client capabilities the CLI declares."""

YES = frozenset({"y", "yes", "true", "1"})
NO = frozenset({"n", "no", "false", "0"})


def parse_answers(text: str | None) -> dict[str, Any] | None:
    """`--answers`: a JSON object of field values (absent: None)."""
    if text is None:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"--answers is not valid JSON ({exc}): {text}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--answers must be a JSON object of field values such as '{{\"confirm\": true}}', not {text}")
    return value


class Answerer:
    """Answers form elicitations from `answers` and, if `interactive`, prompts on `err` read from `stdin`.

    `say` writes a one-line notice; `before_prompt` clears what else is on the terminal (the progress bar)."""

    def __init__(
        self,
        answers: Mapping[str, Any] | None,
        *,
        interactive: bool,
        stdin: TextIO,
        err: TextIO,
        say: Callable[[str], None],
        before_prompt: Callable[[], None] = lambda: None,
    ) -> None:
        self._answers = answers
        self._interactive = interactive
        self._stdin = stdin
        self._err = err
        self._say = say
        self._before_prompt = before_prompt
        self._lock = asyncio.Lock()  # one prompt at a time, however many questions arrive at once
        self._typed = b""
        """What was typed beyond the last line read (several lines may come at once, e.g. pasted)."""

    async def __call__(self, method: str, params: Message) -> Message:
        mode = params.get("mode", "form")
        if method != "elicitation/create" or mode != "form":
            what = method if method != "elicitation/create" else f"{mode} elicitation"
            self._say(f"the server asked for {what}, which this client does not answer (it answers form elicitation)")
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: this client does not answer {what}")
        schema = params.get("requestedSchema")
        schema = schema if isinstance(schema, dict) else {}
        properties = schema.get("properties")
        fields: dict[str, Any] = properties if isinstance(properties, dict) else {}
        required = [name for name in schema.get("required") or [] if name in fields]
        question = str(params.get("message", ""))
        content = {name: value for name, value in (self._answers or {}).items() if name in fields}
        async with self._lock:
            if self._interactive and (self._answers is None or any(name not in content for name in required)):
                return await self._prompt(question, fields, required, content)
        missing = [name for name in required if name not in content]
        if self._answers is None or missing:
            lacking = f"--answers lacks {', '.join(missing)}" if self._answers is not None else "no --answers"
            self._say(f"cannot answer {question!r} without a terminal ({lacking}): answered cancel")
            return {"action": "cancel"}
        self._say(f"answered {question!r} with {orjson.dumps(content).decode()}")
        return {"action": "accept", "content": content}

    async def _prompt(
        self, question: str, fields: Mapping[str, Any], required: list[str], content: dict[str, Any]
    ) -> Message:
        """Ask for each field not in `content`; end of input (Ctrl-D) answers `cancel`."""
        self._before_prompt()
        self._err.write(f"{question}\n" if question else "The server asks:\n")
        for name, spec in fields.items():
            if name in content:
                continue
            spec = spec if isinstance(spec, dict) else {}
            while True:
                line = await self._read(_prompt_text(name, spec, name in required))
                if line is None:
                    self._err.write("\n")
                    self._say("no answer (end of input): answered cancel")
                    return {"action": "cancel"}
                if not line:
                    if "default" in spec:
                        content[name] = spec["default"]
                    if name not in required or name in content:
                        break
                    self._err.write(f"  {name} is required\n")
                    continue
                try:
                    content[name] = field_value(line, spec)
                    break
                except ValueError as exc:
                    self._err.write(f"  {exc}\n")
        return {"action": "accept", "content": content}

    async def _read(self, prompt: str) -> str | None:
        """One line typed at the terminal (None at end of input). It reads the descriptor on the event
        loop, not in a thread: a thread blocked in readline would keep Ctrl-C from ending the command."""
        self._err.write(prompt)
        self._err.flush()
        fd = self._stdin.fileno()
        while b"\n" not in self._typed:
            await _readable(fd)
            chunk = os.read(fd, 4096)
            if not chunk:
                line, self._typed = self._typed, b""
                return line.decode(errors="replace").strip() if line else None
            self._typed += chunk
        line, _, self._typed = self._typed.partition(b"\n")
        return line.decode(errors="replace").strip()


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _prompt_text(name: str, spec: Mapping[str, Any], required: bool) -> str:
    kind = str(spec.get("type", "string"))
    about = spec.get("description") or spec.get("title")
    choices = _choices(spec)
    hint = "y/n" if kind == "boolean" else "/".join(map(str, choices)) if choices else kind
    default = f", default {spec['default']!r}" if "default" in spec else ""
    optional = "" if required else ", optional"
    return f"  {name}" + (f" ({about})" if about else "") + f" [{hint}{default}{optional}]: "


def _choices(spec: Mapping[str, Any]) -> list[Any]:
    """An enum's values (`enum`, or the `const`s of `oneOf`)."""
    if isinstance(spec.get("enum"), list):
        return list(spec["enum"])
    options = spec.get("oneOf")
    if isinstance(options, list):
        return [option["const"] for option in options if isinstance(option, dict) and "const" in option]
    return []


def field_value(text: str, spec: Mapping[str, Any]) -> Any:
    """A typed line as the field's JSON value; ValueError saying what is expected."""
    kind = spec.get("type", "string")
    if kind == "boolean":
        if text.lower() in YES:
            return True
        if text.lower() in NO:
            return False
        raise ValueError("answer y or n")
    if kind in ("integer", "number"):
        try:
            number = int(text) if kind == "integer" else float(text)
        except ValueError:
            raise ValueError(f"answer {'an' if kind == 'integer' else 'a'} {kind}") from None
        return number
    choices = _choices(spec)
    if choices and text not in choices:
        raise ValueError(f"answer one of {', '.join(map(str, choices))}")
    return text
