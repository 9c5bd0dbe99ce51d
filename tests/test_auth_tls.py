"""`[server] tls_cert`/`tls_key`: the gateway serves HTTPS itself, with a self-signed certificate made
here; the official SDK client that trusts it connects (with an api key), one that does not is refused."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.config import ConfigError, ServerConfig
from gateway.tls import tls_context
from tests.conftest import EXAMPLE_SERVER, start_gateway

KEY = "tls-test-key"


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def https_gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[str, Path]]:
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    config = (
        f'[server]\ntls_cert = "{cert}"\ntls_key = "{key}"\n[auth]\nmode = "api_key"\n'
        f'[[auth.api_keys]]\nname = "tls"\nsha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"\n'
    )
    async with start_gateway(upstream_cmd=EXAMPLE_SERVER, config_text=config, scheme="https") as gw:
        yield gw.url, cert


@pytest.mark.asyncio(loop_scope="module")
async def test_the_sdk_client_trusting_the_certificate_connects(https_gateway: tuple[str, Path]) -> None:
    url, cert = https_gateway
    trusted = ssl.create_default_context(cafile=str(cert))
    http = httpx2.AsyncClient(verify=trusted, headers={"Authorization": f"Bearer {KEY}"})
    async with asyncio.timeout(60), Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        result = await client.call_tool("echo", {"text": "over TLS"})
        assert not result.is_error and "over TLS" in str(result.content), result


@pytest.mark.asyncio(loop_scope="module")
async def test_a_client_that_does_not_trust_it_is_refused(https_gateway: tuple[str, Path]) -> None:
    url, _ = https_gateway
    async with httpx2.AsyncClient() as http:
        with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await http.post(url, json={})


def test_a_missing_certificate_is_a_config_error(tmp_path: Path) -> None:
    server = ServerConfig(tls_cert=str(tmp_path / "none.pem"), tls_key=str(tmp_path / "none.key"))
    with pytest.raises(ConfigError, match=r"server\.tls_cert/tls_key: cannot load"):
        tls_context(server)
    with pytest.raises(ValueError, match="set both tls_cert and tls_key"):
        ServerConfig(tls_cert="cert.pem")
