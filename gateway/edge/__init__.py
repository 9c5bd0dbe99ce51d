"""The client-facing side: the aiohttp endpoint, HTTP hygiene checks and response relaying."""
