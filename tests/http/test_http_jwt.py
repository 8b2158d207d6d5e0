"""OAuth 2.1 resource server: JWT access tokens checked against a JWKS, with keys made here."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import tempfile
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from httpkit import HttpServer

ISSUER = "https://issuer.example"
AUDIENCE = "https://cubicle.example/mcp"


def jwk_of(key, kid: str) -> dict:
    public = key.public_key()
    if isinstance(key, rsa.RSAPrivateKey):
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))
    else:
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(public))
    jwk["kid"] = kid
    return jwk


@pytest.fixture(scope="module")
def keys():
    return {"rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "ec": ec.generate_private_key(ec.SECP256R1()),
            "stranger": rsa.generate_private_key(public_exponent=65537, key_size=2048)}


@pytest.fixture(scope="module")
def srv(cubicle_bin, keys):
    with tempfile.NamedTemporaryFile("w", suffix=".jwks", delete=False) as f:
        json.dump({"keys": [jwk_of(keys["rsa"], "r1"), jwk_of(keys["ec"], "e1")]}, f)
    try:
        with HttpServer("--jwks-file", f.name, "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, tag="http-jwt") as s:
            yield s
    finally:
        Path(f.name).unlink()


def token(key, alg: str, kid: str, **claims) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "iat": now, "exp": now + 300, **claims}
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


def status(srv, bearer: str) -> int:
    return srv.request("GET", "/metrics", headers={"authorization": f"Bearer {bearer}"}).status_code


@pytest.mark.no_image
def test_protected_resource_metadata(srv):
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        r = srv.request("GET", path)
        assert r.status_code == 200
        meta = r.json()
        assert meta["resource"] == AUDIENCE and meta["authorization_servers"] == [ISSUER]
        assert meta["bearer_methods_supported"] == ["header"]
    r = srv.request("POST", body={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert r.status_code == 401
    assert 'resource_metadata="https://cubicle.example/.well-known/oauth-protected-resource/mcp"' in r.headers["www-authenticate"]


@pytest.mark.no_image
def test_good_tokens(srv, keys):
    assert status(srv, token(keys["rsa"], "RS256", "r1")) == 200
    assert status(srv, token(keys["ec"], "ES256", "e1")) == 200
    assert status(srv, token(keys["rsa"], "RS256", "r1", aud=["https://other.example", AUDIENCE])) == 200


@pytest.mark.no_image
def test_bad_tokens(srv, keys):
    now = int(time.time())
    rsa_key = keys["rsa"]
    assert status(srv, token(rsa_key, "RS256", "r1", exp=now - 120)) == 401, "expired"
    assert status(srv, token(rsa_key, "RS256", "r1", nbf=now + 600)) == 401, "not yet valid"
    assert status(srv, token(rsa_key, "RS256", "r1", aud="https://other.example/mcp")) == 401, "wrong audience"
    assert status(srv, token(rsa_key, "RS256", "r1", iss="https://evil.example")) == 401, "wrong issuer"
    assert status(srv, token(keys["stranger"], "RS256", "r1")) == 401, "bad signature"
    assert status(srv, token(keys["stranger"], "RS256", "unknown")) == 401, "unknown key"
    good = token(rsa_key, "RS256", "r1")
    head, claims, _ = good.split(".")
    assert status(srv, f"{head}.{claims}.") == 401, "no signature"
    none = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": now + 300}, None, algorithm="none")
    assert status(srv, none) == 401, "alg none"
    # Algorithm confusion: HS256 keyed with the public key (PyJWT refuses to make one, so by hand).
    pem = rsa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = b64(json.dumps({"alg": "HS256", "kid": "r1"}).encode()) + "." + \
        b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": now + 300}).encode())
    forged = signing_input + "." + b64(hmac.new(pem, signing_input.encode(), hashlib.sha256).digest())
    assert status(srv, forged) == 401, "HS256 with the public key"
    assert status(srv, "not.a.jwt") == 401
    # An ES256 token claiming the RSA key's kid.
    assert status(srv, token(keys["ec"], "ES256", "r1")) == 401
