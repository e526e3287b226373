"""Keys for signature tests, made once per session (RSA 2048, EC P-256, a 32-byte HMAC secret)."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

HMAC_SECRET = "a-shared-secret-long-enough-for-hs512-" + "0123456789abcdef" * 2
ROOT = Path(__file__).resolve().parents[2]


def _pem(private: object) -> tuple[str, str]:
    priv = private.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    pub = private.public_key().public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return priv, pub


@functools.cache
def rsa_pair(n: int = 0) -> tuple[str, str]:
    return _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))


@functools.cache
def ec_pair(n: int = 0, bits: int = 256) -> tuple[str, str]:
    curve = {256: ec.SECP256R1(), 384: ec.SECP384R1(), 512: ec.SECP521R1()}[bits]
    return _pem(ec.generate_private_key(curve))


def keys_for(alg: str, n: int = 0) -> tuple[str, str]:
    """(signing key, verification key) for an algorithm."""
    if alg.startswith("HS"):
        secret = HMAC_SECRET if n == 0 else HMAC_SECRET + "-other"
        return secret, secret
    return rsa_pair(n) if alg.startswith(("RS", "PS")) else ec_pair(n, int(alg[2:]))


def copy_bundle(tmp: Path, name: str = "payments-rego") -> Path:
    dest = tmp / name
    shutil.copytree(ROOT / "bundles" / name, dest)
    return dest
