# mcp-task-gateway in front of the example MCP server (stdio). Replace the CMD's --upstream-cmd or
# --upstream-url (or mount a config and pass --config) to put it in front of your own server.
#
#   docker build -t mcp-task-gateway . && docker run --rm -p 127.0.0.1:8765:8765 mcp-task-gateway
#
# The image can start the usual stdio upstreams itself: `npx -y @modelcontextprotocol/server-…` (Node.js
# and npm) and `uvx mcp-server-…` (uv). An upstream on the host is --upstream-url
# http://host.docker.internal:PORT/mcp; on Linux that name needs `--add-host=host.docker.internal:host-gateway`.
#
# The default Host/Origin allow-lists accept loopback names only (localhost:*, 127.0.0.1:*, [::1]:*), which
# is what a published port on the host's loopback sees; to reach it under another name, set
# server.allowed_hosts / server.allowed_origins in a config file.
#
# trixie: its Debian nodejs is 20 (bookworm's is 18).
FROM python:3.11-slim-trixie

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_PYTHON_DOWNLOADS=never

# Runtimes for stdio upstreams, from Debian's packages and PyPI (no binary downloads): Node.js with npm and
# npx, and uv with uvx (it runs PyPI servers on this image's Python, never a downloaded one).
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs npm \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir "uv>=0.5"

WORKDIR /app
# The gateway's dependencies, read from pyproject.toml alone, in a layer of their own: a change to the
# source does not reinstall them.
COPY pyproject.toml /app/
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY . /app
# The code stays root-owned and read-only to the runtime user; only data/ (the default SQLite store,
# [store] path = "data/gateway.db") is the runtime user's, a volume so tasks outlive the container. The
# user has a home for npx's and uvx's caches.
RUN pip install --no-cache-dir --no-deps . \
    && useradd --system --uid 10001 --create-home --home-dir /home/gateway --shell /usr/sbin/nologin gateway \
    && mkdir /app/data && chown 10001 /app/data
VOLUME ["/app/data"]

USER 10001
EXPOSE 8765

# /readyz: healthy only while the upstream is usable (a 503 raises, so the check fails); /healthz is liveness.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request\ntry: urllib.request.urlopen('http://127.0.0.1:8765/readyz', timeout=2)\nexcept OSError as exc: sys.exit(f'not ready: {exc}')"]

CMD ["mcp-task-gateway", "serve", "--listen", "0.0.0.0:8765", "--allow-unauthenticated", "--upstream-cmd", "python examples/build_server.py"]
