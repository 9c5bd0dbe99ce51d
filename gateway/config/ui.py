"""`[ui]`: the task timeline page at /ui (on by default); it shows only what the caller may already see."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.config.section import Section

if TYPE_CHECKING:
    from gateway.config.file import Config

UI_PATH = "/ui"
"""Where the page is served on the main listener (its files under `/ui/`)."""


class UiConfig(Section):
    enabled: bool = True
    """Serve /ui (static files and /ui/config.json); false: /ui answers 404. The page has no powers of
    its own: everything it shows or does goes through the MCP endpoint with the caller's credentials."""


def ui_problems(config: Config) -> list[tuple[str, str]]:
    """An MCP endpoint path the page's own paths would shadow (or be shadowed by)."""
    path = config.server.path
    if config.ui.enabled and (path == UI_PATH or path.startswith(UI_PATH + "/")):
        return [
            ("server.path", f"{path!r} is where [ui] serves its page: choose another path or set [ui] enabled = false")
        ]
    return []
