"""Bundle signatures in OPA's format: OPA's own vectors, the round trip per algorithm, and the
refusal matrix (tampered, added and removed files, wrong key, expired and absent signatures, wrong
scope, unknown key id), each with its reason."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from kernel.errors import ValidationError
from kernel.policy.rego import load_rego_bundle
from kernel.policy.signature import (
    SIGNATURES_FILE,
    SignatureRefused,
    VerificationKey,
    hashed_bytes,
    read_bundle_files,
    sign_bundle_files,
    verify_bundle_files,
    verify_token,
)
from tests.policy.signing_keys import copy_bundle, keys_for

# From OPA's v1/bundle/verify_test.go: a token signed with RS256 (kid "foo", scope "write").
OPA_RS256_TOKEN = (
    "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCIsImtpZCI6ImZvbyJ9.eyJmaWxlcyI6W3sibmFtZSI6ImRiL3VhbTIvZW50aXRsZW1lbnRz"
    "L2RhdGEuanNvbiIsImhhc2giOiJjMjEzMTU0NGM3MTZhMjVhNWUzMWY1MDQzMDBmNTI0MGU4MjM1Y2FkYjlhNTdmMGJkMWI2ZjRiZDc0Yj"
    "I2NjEyIiwiYWxnb3JpdGhtIjoic2hhMjU2In0seyJuYW1lIjoiZGIvdWFtMi9wb2xpY3kvb3BhLXBvbGljeS5yZWdvIiwiaGFzaCI6IjQy"
    "Y2ZlNjc2OGI1N2JiNWY3NTAzYzE2NWMyOGRkMDdhYzViODEzNTU0ZWJjODUwZjJjYzM1ODQzZTcxMzdiMWQifV0sImlhdCI6MTU5MjI1MT"
    "QwNiwiaXNzIjoiSldUU2VydmljZSIsInNjb3BlIjoid3JpdGUifQ.UZcX_Qj29o213nwZ5mysiyNcgAp1AOqCkDLkj1KGZ7Cw3l17TbkF8t"
    "3FJd654sf762NGcABA0WQ2zxq-labXl_d5TKQmq23lurO3qLHI1cKQPyoxPbddGo78sJpMwWsiMyEYcyyKC9FpNUpa8cT81GPo4q9Zui8TA"
    "D0wtHh2YxBL7E8QYLJxcLMJTJxVBgrQGLXFT7vYRc6hJz9Vu-i0SWuLBGxOCmYoHr4DWFfy0IhAbhiUFyLRpukfBPjCJNYY5LgaZdN6LaY"
    "ivtIEUms5jUuXubBimLJm7KOT5-bgJMXTcUsbrbl2Ma7PwG5IOKjjgyEvH8KVfGFZSzNrpuxKmA"
)
OPA_PUBLIC_KEY = """-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA9KaakMv1XKKDaSch3PFR
3a27oaHp1GNTTNqvb1ZaHZXp+wuhYDwc/MTE67x9GCifvQBWzEGorgTq7aisiOyl
vKifwz6/wQ+62WHKG/sqKn2Xikp3P63aBIPlZcHbkyyRmL62yeyuzYoGvLEYel+m
z5SiKGBwviSY0Th2L4e5sGJuk2HOut6emxDi+E2Fuuj5zokFJvIT6Urlq8f3h6+l
GeR6HUOXqoYVf7ff126GP7dticTVBgibxkkuJFmpvQSW6xmxruT4k6iwjzbZHY7P
ypZ/TdlnuGC1cOpAVyU7k32IJ9CRbt3nwEf5U54LRXLLQjFixWZHwKdDiMTF4ws0
+wIDAQAB
-----END PUBLIC KEY-----"""


def test_structured_files_hash_like_opa() -> None:
    # OPA's TestVerifyBundleFile: this manifest's MD5 over the canonical encoding.
    raw = b'{"revision": "quickbrownfaux"}'
    assert hashlib.md5(hashed_bytes(".manifest", raw)).hexdigest() == "a005c38a509dc2d5a7407b9494efb2ad"
    doc = b'{"b": [1, 2.50, "<&>\\u2028"], "a": {"y": null, "x": true}}'
    assert hashed_bytes("x/data.json", doc) == b'{"a":{"x":true,"y":null},"b":[1,2.50,"<&>\\u2028"]}'
    assert hashed_bytes("policy.rego", b"package x\n") == b"package x\n"


def test_an_opa_signed_token_verifies_with_its_key_id_and_scope() -> None:
    claims = verify_token(OPA_RS256_TOKEN, [VerificationKey(OPA_PUBLIC_KEY, "RS256", "foo", "write")])
    assert [f["name"] for f in claims["files"]] == ["db/uam2/entitlements/data.json", "db/uam2/policy/opa-policy.rego"]
    with pytest.raises(SignatureRefused) as exc:
        verify_token(OPA_RS256_TOKEN, [VerificationKey(OPA_PUBLIC_KEY, "RS256", "foo", "read")])
    assert exc.value.reason == "scope_mismatch"
    with pytest.raises(SignatureRefused) as exc:
        verify_token(OPA_RS256_TOKEN, [VerificationKey(OPA_PUBLIC_KEY, "RS256", "bar", "write")])
    assert exc.value.reason == "key_unknown"


def _sign(bundle: Path, alg: str = "RS256", *, n: int = 0, **kw: object) -> None:
    priv, _ = keys_for(alg, n)
    files = read_bundle_files(bundle)
    (bundle / SIGNATURES_FILE).write_text(sign_bundle_files(files, priv, algorithm=alg, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("alg", ["RS256", "ES256", "HS256", "PS384", "ES384", "HS512"])
def test_a_signed_bundle_verifies_and_still_loads(tmp_path: Path, alg: str) -> None:
    bundle = copy_bundle(tmp_path)
    _sign(bundle, alg, key_id="k1", scope="prod")
    _, pub = keys_for(alg)
    claims = verify_bundle_files(read_bundle_files(bundle), VerificationKey(pub, alg, "k1", "prod"))
    assert claims is not None
    assert sorted(f["name"] for f in claims["files"]) == [".manifest", "data.json", "policy.rego"]
    assert load_rego_bundle(bundle).revision  # the loader ignores .signatures.json


def test_structured_files_may_be_reformatted_after_signing(tmp_path: Path) -> None:
    bundle = copy_bundle(tmp_path)
    _sign(bundle)
    data = json.loads((bundle / "data.json").read_text())
    (bundle / "data.json").write_text(json.dumps(data, indent=4, sort_keys=True))
    _, pub = keys_for("RS256")
    assert verify_bundle_files(read_bundle_files(bundle), VerificationKey(pub))


def _refusal(bundle: Path, key: VerificationKey | None) -> str:
    with pytest.raises(SignatureRefused) as exc:
        verify_bundle_files(read_bundle_files(bundle), key)
    return exc.value.reason


def test_the_refusal_matrix(tmp_path: Path) -> None:
    _, pub = keys_for("RS256")
    _, other_pub = keys_for("RS256", 1)
    key = VerificationKey(pub, "RS256", "k1", "prod")

    def fresh(name: str, **kw: object) -> Path:
        b = copy_bundle(tmp_path / name)
        _sign(b, key_id="k1", scope="prod", **kw)
        return b

    tampered = fresh("tampered")
    (tampered / "policy.rego").write_text((tampered / "policy.rego").read_text().replace("1000", "1"))
    assert _refusal(tampered, key) == "digest_mismatch"
    added = fresh("added")
    (added / "extra.rego").write_text("package payments\n")
    assert _refusal(added, key) == "file_unsigned"
    removed = fresh("removed")
    (removed / "data.json").unlink()
    assert _refusal(removed, key) == "file_missing"
    assert _refusal(fresh("wrong-key"), VerificationKey(other_pub, "RS256", "k1", "prod")) == "signature_invalid"
    assert _refusal(fresh("wrong-alg"), VerificationKey(pub, "RS384", "k1", "prod")) == "signature_invalid"
    expired = fresh("expired", claims={"exp": int(time.time()) - 60})
    assert _refusal(expired, key) == "signature_expired"
    absent = copy_bundle(tmp_path / "absent")
    assert _refusal(absent, key) == "signature_missing"
    assert _refusal(fresh("scope"), VerificationKey(pub, "RS256", "k1", "staging")) == "scope_mismatch"
    assert _refusal(fresh("no-scope-wanted"), VerificationKey(pub, "RS256", "k1")) == "scope_mismatch"
    assert _refusal(fresh("kid"), VerificationKey(pub, "RS256", "k2", "prod")) == "key_unknown"
    assert _refusal(fresh("unexpected"), None) == "signature_unexpected"
    garbled = fresh("garbled")
    (garbled / SIGNATURES_FILE).write_text('{"signatures": ["a", "b"]}')
    assert _refusal(garbled, key) == "signature_malformed"


@pytest.mark.parametrize("where", ["header kid", "payload keyid"])
def test_a_key_id_holding_a_lone_surrogate_is_an_unknown_key(where: str) -> None:
    # JSON may escape a lone surrogate; comparing it with the configured ids raised
    # UnicodeEncodeError (a 500 on upload, a crash in the puller's cycle) before the signature.
    import base64

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    head, body = ((b'{"alg":"HS256","kid":"\\ud800"}', b'{"files":[]}') if where == "header kid"
                  else (b'{"alg":"HS256"}', b'{"keyid":"\\udfff","files":[]}'))
    keys = [VerificationKey("k" * 32, "HS256", "k1"), VerificationKey("j" * 32, "HS256", "k2")]
    with pytest.raises(SignatureRefused) as refused:
        verify_token(f"{b64(head)}.{b64(body)}.{b64(b'sig')}", keys)
    assert refused.value.reason == "key_unknown"


def test_a_tarball_with_corrupt_gzip_data_is_a_clear_refusal() -> None:
    # A good gzip header over corrupt deflate data raised zlib.error past the tarball reader.
    import gzip

    good = gzip.compress(b"x" * 4096)
    corrupt = good[:12] + bytes(b ^ 0x5A for b in good[12:-8]) + good[-8:]
    with pytest.raises(ValidationError, match="not a readable tarball"):
        read_bundle_files(corrupt)


def test_an_unsigned_bundle_passes_when_no_key_is_configured(tmp_path: Path) -> None:
    assert verify_bundle_files(read_bundle_files(copy_bundle(tmp_path)), None) is None


def test_a_tarball_with_a_top_directory_verifies_like_the_directory(tmp_path: Path) -> None:
    import tarfile

    bundle = copy_bundle(tmp_path)
    _sign(bundle)
    tgz = tmp_path / "b.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(bundle, arcname="payments-rego")
    _, pub = keys_for("RS256")
    assert verify_bundle_files(read_bundle_files(tgz), VerificationKey(pub))


def test_a_tarball_naming_a_file_twice_is_refused(tmp_path: Path) -> None:
    """Two members with one name: the verifier and a loader could each take another copy (a signed
    one checked, the other one run); the tarball is refused instead, as the Rego loader does."""
    import io
    import tarfile

    bundle = copy_bundle(tmp_path)
    _sign(bundle)
    tgz = tmp_path / "twice.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        for f in sorted(bundle.iterdir()):
            tar.add(f, arcname=f.name)
        evil = b'package payments\n\nimport rego.v1\n\ndecision := {"decision": "allow", "rule_id": "x"}\n'
        info = tarfile.TarInfo("policy.rego")
        info.size = len(evil)
        tar.addfile(info, io.BytesIO(evil))
    with pytest.raises(ValidationError, match=r"policy\.rego appears twice"):
        read_bundle_files(tgz)
