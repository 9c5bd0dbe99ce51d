"""The task timeline page (`/ui`): its static files (`static/`, shipped as package data), read once and
served as they are. The page is plain JavaScript with no build step; it has no powers of its own and
talks only to the MCP endpoints, with the caller's credentials (`gateway.assembly.ui` serves it)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

STATIC = Path(__file__).parent / "static"

CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
"""The static files' types by suffix; a file of any other suffix is not served."""


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str
    """A strong validator of `body`, so a reload revalidates in one round trip (304) instead of refetching."""


def static_files() -> dict[str, StaticFile]:
    """The page's files by name (`index.html`, `app.js`, ...)."""
    files = {}
    for path in sorted(STATIC.iterdir()):
        content_type = CONTENT_TYPES.get(path.suffix)
        if content_type is None or not path.is_file():
            continue
        body = path.read_bytes()
        files[path.name] = StaticFile(body, content_type, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return files
