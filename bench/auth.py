"""What authentication costs: token validation per request, and the latency oauth mode adds over none.

Part one runs `gateway.edge.tokens.OAuthTokens` in this process against a JWKS served on loopback:
the median cost of validating a token already in the cache, and of validating new RS256 and ES256
tokens (signature and claims; the key set already fetched), and of the per-tool rules a permitted
`tools/call` passes (the rule lookup, scopes, claim conditions and the per-tool bucket). Part two starts
three gateways in front of the example server (stdio), one with `[auth] mode = "none"`, one with
`mode = "oauth"` (the same JWKS) and one with oauth and `[[auth.rules]]` (the called tool behind the
third rule, with scopes, claim conditions and a per-tool rate), and times N sequential 2026-07-28 `echo`
tools/calls through each with one raw aiohttp client, alternating between them so that drift hits all
alike. Prints markdown tables; `--json` also writes the numbers.

    python bench/auth.py [--tokens 20000] [--calls 500] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import socket
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.config import AuthConfig, AuthRule, JwtConfig  # noqa: E402
from gateway.edge.auth import EdgeAuth, Principal  # noqa: E402
from gateway.edge.limits import PrincipalLimits  # noqa: E402
from gateway.edge.tokens import OAuthTokens  # noqa: E402

ISSUER = "http://issuer.bench"
MODERN = "2026-07-28"
STARTUP_TIMEOUT_S = 30.0
RULES = """
[[auth.rules]]
match = "deploy*"
scopes = ["deploy"]
[[auth.rules]]
match = "build_*"
scopes = ["build"]
[[auth.rules]]
match = "echo"
scopes = ["read"]
claims = { groups = "bench", tenant = "acme" }
requests_per_s = 1000000.0
burst = 1000000
"""
"""Three rules, the called tool (`echo`) behind the last, with every kind of check; never refused."""


def signing_keys() -> dict[str, tuple[str, Any]]:
    return {
        "RS256": ("r1", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        "ES256": ("e1", ec.generate_private_key(ec.SECP256R1())),
    }


def jwks_of(keys: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    out = []
    for algorithm, (kid, private) in keys.items():
        public = json.loads(jwt.get_algorithm_by_name(algorithm).to_jwk(private.public_key()))
        out.append({**public, "kid": kid, "alg": algorithm, "use": "sig"})
    return {"keys": out}


def token(keys: dict[str, tuple[str, Any]], algorithm: str, resource: str, subject: str) -> str:
    kid, private = keys[algorithm]
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": subject, "aud": resource, "exp": now + 3600, "iat": now, "scope": "read"}
    claims |= {"groups": ["ops", "bench"], "tenant": "acme"}
    return jwt.encode(claims, private, algorithm=algorithm, headers={"kid": kid})


@contextlib.asynccontextmanager
async def jwks_server(document: dict[str, Any]) -> AsyncIterator[str]:
    app = web.Application()

    async def handle(_: web.Request) -> web.Response:
        return web.json_response(document)

    app.router.add_get("/jwks", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/jwks"
    finally:
        await runner.cleanup()


def median_us(samples_s: list[float]) -> float:
    return round(statistics.median(samples_s) * 1e6, 2)


async def validation_costs(keys: dict[str, tuple[str, Any]], jwks_url: str, count: int) -> dict[str, float]:
    resource = "http://gateway.bench/mcp"
    config = AuthConfig(
        mode="oauth",
        resource=resource,
        authorization_servers=[ISSUER],
        jwt=JwtConfig(issuer=ISSUER, jwks_uri=jwks_url, algorithms=["RS256", "ES256"]),
    )
    tokens = OAuthTokens(config)
    results: dict[str, float] = {}
    try:
        cached = token(keys, "RS256", resource, "cached")
        await tokens.validate(cached)
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            await tokens.validate(cached)
            samples.append(time.perf_counter() - started)
        results["cached_us"] = median_us(samples)
        for algorithm in ("RS256", "ES256"):
            fresh = [token(keys, algorithm, resource, f"s{i}") for i in range(min(count, 2000))]
            samples = []
            for value in fresh:
                started = time.perf_counter()
                await tokens.validate(value)
                samples.append(time.perf_counter() - started)
            results[f"uncached_{algorithm}_us"] = median_us(samples)
    finally:
        await tokens.close()
    return results


def rule_cost(count: int) -> float:
    """The median cost of `[[auth.rules]]` for a permitted `tools/call`: what the edge runs per call."""
    config = AuthConfig.model_validate(
        {"mode": "oauth", "resource": "http://gw/mcp", "authorization_servers": [ISSUER], "jwt": {"issuer": ISSUER}}
        | {"rules": [AuthRule.model_validate(rule) for rule in tomllib.loads(RULES)["auth"]["rules"]]}
    )

    async def never_called(_: str) -> Any:
        raise AssertionError

    auth = EdgeAuth(config, "http://gw/mcp", never_called)
    limits = PrincipalLimits(config.limits, rules=config.rules)
    principal = Principal("p_bench", frozenset({"read"}), {"groups": ["ops", "bench"], "tenant": "acme"})
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        rule = auth.check_call(principal, message)
        assert rule is not None
        limits.admit_call(principal.owner, "echo", rule)
        samples.append(time.perf_counter() - started)
    return median_us(samples)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def gateway(config_text: str, port: int) -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gateway.toml"
        # Memory stores: gateways side by side in one directory must not share a SQLite file.
        config.write_text(config_text + '\n[store]\nkind = "memory"\n[logging]\nlevel = "warning"\n', encoding="utf-8")
        upstream = shlex.join([sys.executable, str(ROOT / "examples" / "build_server.py")])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--listen", f"127.0.0.1:{port}", "--config", str(config),
            "--upstream-cmd", upstream,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, cwd=ROOT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT_S):
                while "listening on" not in (line := (await proc.stdout.readline()).decode()):
                    if not line:
                        raise RuntimeError("the gateway exited before it was ready")
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            await proc.wait()


async def call_latencies(urls: dict[str, tuple[str, dict[str, str]]], calls: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in urls}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "echo",
            "arguments": {"text": "x"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "echo",
    }
    async with aiohttp.ClientSession() as http:
        for round_ in range(calls + 50):  # the first 50 warm up
            for name, (url, extra) in urls.items():
                started = time.perf_counter()
                async with http.post(url, json=body, headers={**headers, **extra}) as response:
                    await response.read()
                    assert response.status == 200, (name, response.status)
                if round_ >= 50:
                    samples[name].append(time.perf_counter() - started)
    return {name: round(statistics.median(values) * 1000, 3) for name, values in samples.items()}


async def main(token_count: int, calls: int) -> dict[str, Any]:
    keys = signing_keys()
    async with jwks_server(jwks_of(keys)) as jwks_url:
        costs = await validation_costs(keys, jwks_url, token_count)
        costs["rules_us"] = rule_cost(token_count)
        resource = "http://127.0.0.1/mcp"  # the audience only: every gateway accepts tokens for it
        oauth_config = (
            f'[auth]\nmode = "oauth"\nresource = "{resource}"\nauthorization_servers = ["{ISSUER}"]\n'
            f'[auth.jwt]\nissuer = "{ISSUER}"\njwks_uri = "{jwks_url}"\n'
            # The rate is measured, not limited (the bucket's cost is still in the numbers).
            "[auth.limits]\nrequests_per_s = 1000000.0\nburst = 1000000\n"
        )
        bearer = {"Authorization": f"Bearer {token(keys, 'RS256', resource, 'bench')}"}
        async with (
            gateway("", free_port()) as none_url,
            gateway(oauth_config, free_port()) as oauth_url,
            gateway(oauth_config + RULES, free_port()) as rules_url,
        ):
            urls = {"none": (none_url, {}), "oauth": (oauth_url, bearer), "rules": (rules_url, bearer)}
            latency = await call_latencies(urls, calls)
    return {"validation": costs, "tools_call_median_ms": latency, "python": platform.python_version()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    result = asyncio.run(main(args.tokens, args.calls))
    costs, latency = result["validation"], result["tools_call_median_ms"]
    print("| validation (median) | µs |\n|---|---|")
    print(f"| cached token | {costs['cached_us']} |")
    print(f"| new RS256 token | {costs['uncached_RS256_us']} |")
    print(f"| new ES256 token | {costs['uncached_ES256_us']} |")
    print(f"| `[[auth.rules]]` of a permitted tools/call | {costs['rules_us']} |")
    print(
        "\n| 2026-07-28 `echo` tools/call (median, ms) | none | oauth | oauth + rules "
        "| added by oauth | added by rules |\n|---|---|---|---|---|---|"
    )
    by_oauth = round(latency["oauth"] - latency["none"], 3)
    by_rules = round(latency["rules"] - latency["oauth"], 3)
    print(
        f"| gateway → stdio example server | {latency['none']} | {latency['oauth']} | {latency['rules']} "
        f"| {by_oauth} | {by_rules} |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
