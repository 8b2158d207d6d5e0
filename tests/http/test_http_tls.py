"""HTTPS with --tls-cert/--tls-key, with a certificate made here."""

from __future__ import annotations

import datetime
import ipaddress
import tempfile
from pathlib import Path

import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from httpkit import HttpServer, raw_exchange


@pytest.fixture(scope="module")
def certificate():
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    folder = Path(tempfile.mkdtemp(prefix="cubicle-tls-"))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    yield folder
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()


@pytest.mark.no_image
def test_https(certificate):
    cert, key = certificate / "cert.pem", certificate / "key.pem"
    with HttpServer("--tls-cert", str(cert), "--tls-key", str(key), tag="http-tls") as srv:
        assert "serving MCP on https://" in srv.log()
        with httpx2.Client(verify=str(cert), timeout=10) as c:
            r = c.get(f"https://127.0.0.1:{srv.port}/healthz")
            assert r.status_code == 200 and r.text == "ok\n"
            r = c.post(f"https://127.0.0.1:{srv.port}/mcp", headers={"accept": "application/json", "content-type": "application/json"},
                       content=b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}')
            assert r.status_code == 200 and r.headers["mcp-session-id"]
        # Plain HTTP on the TLS port gets no HTTP answer.
        assert not raw_exchange(srv.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", read_timeout=3).startswith(b"HTTP/")


@pytest.mark.no_image
def test_tls_needs_both_files(cubicle_bin, certificate):
    with pytest.raises(RuntimeError, match="exited with 2"):
        HttpServer("--tls-cert", str(certificate / "cert.pem"), tag="http-tls-bad").start()
