"""The v1 agent request signature and the webhook signature (rebuno-v0 §8.3, §8.5), pinned by the
four published vectors in `tests/fixtures/signature_vectors.json`, then the verification rules
unit by unit and over real HTTP."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel.signing import (
    sign_request,
    signature_message,
    verify_request,
    verify_webhook_signature,
    webhook_signature,
)
from tests.conftest import Running
from tests.support import ServerThread, sign

_DATA = json.loads((Path(__file__).parent / "fixtures" / "signature_vectors.json").read_text(encoding="utf-8"))
SECRET: str = _DATA["secret"]
TS: str = _DATA["timestamp"]
NOW = int(TS)
VECTORS: list[dict[str, Any]] = _DATA["vectors"]
IDS = [v["id"] for v in VECTORS]


def _body(v: dict[str, Any]) -> bytes:
    b = v["body"].encode("utf-8")
    assert b.hex() == v["body_utf8_hex"]
    return b


def _verify(v: dict[str, Any], presented: str | None = None, *, secret: str = SECRET, timestamp: str = TS,
            now: int = NOW, **changes: Any) -> bool:
    fields = {"method": v["method"], "target": v["target"], "dispatch_id": v["dispatch_id"],
              "dispatch_attempt": v["dispatch_attempt"], "body": _body(v)}
    fields.update(changes)
    return verify_request(secret, v["signature"] if presented is None else presented, timestamp=timestamp,
                          now_unix=now, **fields)


def test_fixture_has_the_four_published_vectors() -> None:
    assert len(VECTORS) == 4 and SECRET == "test-secret" and TS == "1700000000"
    for v in VECTORS:
        assert hmac.new(SECRET.encode(), bytes.fromhex(v["message_hex"]), hashlib.sha256).hexdigest() == v["signature"][3:]


@pytest.mark.parametrize("v", VECTORS, ids=IDS)
def test_message_layout(v: dict[str, Any]) -> None:
    msg = signature_message(v["method"], v["target"], TS, v["dispatch_id"], v["dispatch_attempt"], _body(v))
    assert msg.hex() == v["message_hex"]
    assert msg.startswith(b"rebuno-request-v1\n") and msg.count(b"\n") >= 6


@pytest.mark.parametrize("v", VECTORS, ids=IDS)
def test_sign_request_matches_the_published_vector(v: dict[str, Any]) -> None:
    got = sign_request(SECRET, v["method"], v["target"], TS, v["dispatch_id"], v["dispatch_attempt"], _body(v))
    assert got == v["signature"]
    assert got.startswith("v1=") and len(got) == 67 and got[3:] == got[3:].lower()


@pytest.mark.parametrize("v", VECTORS, ids=IDS)
def test_good_signature_verifies(v: dict[str, Any]) -> None:
    assert _verify(v)


@pytest.mark.parametrize("v", VECTORS, ids=IDS)
def test_wrong_secret_fails(v: dict[str, Any]) -> None:
    assert not _verify(v, secret="test-secret2")
    assert not _verify(v, secret="Test-secret")


@pytest.mark.parametrize("v", VECTORS, ids=IDS)
def test_every_bound_field_matters(v: dict[str, Any]) -> None:
    assert not _verify(v, method="PUT")
    assert not _verify(v, target=v["target"] + "?")
    assert not _verify(v, target=v["target"].upper())
    assert not _verify(v, dispatch_id="01920000-0000-7000-8000-000000000002")
    assert not _verify(v, dispatch_attempt="4")
    assert not _verify(v, body=_body(v) + b" ")
    other_ts = str(NOW + 1)
    assert not _verify(v, timestamp=other_ts, now=NOW)


@pytest.mark.parametrize("v", VECTORS, ids=IDS)
def test_signature_spelling_is_exact(v: dict[str, Any]) -> None:
    sig = v["signature"]
    assert not _verify(v, "v1=" + sig[3:].upper())  # case-sensitive
    assert not _verify(v, "V1=" + sig[3:])
    assert not _verify(v, sig[3:])  # no scheme
    assert not _verify(v, "sha256=" + sig[3:])
    assert not _verify(v, sig + "0")
    assert not _verify(v, sig[:-1])
    assert not _verify(v, "")
    # the old body-only format is not accepted on requests
    body_only = "sha256=" + hmac.new(SECRET.encode(), _body(v), hashlib.sha256).hexdigest()
    assert not _verify(v, body_only)


@pytest.mark.parametrize(("offset", "ok"), [(0, True), (300, True), (-300, True), (301, False), (-301, False),
                                            (100_000, False), (-100_000, False)],
                         ids=["now", "plus-300", "minus-300", "plus-301", "minus-301", "far-future", "far-past"])
def test_timestamp_window_is_inclusive_300s(offset: int, ok: bool) -> None:
    # A timestamp `offset` seconds in the future (positive) or the past (negative) relative to now.
    v = VECTORS[0]
    ts = str(NOW + offset)
    sig = sign_request(SECRET, v["method"], v["target"], ts, "", "", b"")
    assert verify_request(SECRET, sig, method=v["method"], target=v["target"], timestamp=ts, dispatch_id="",
                          dispatch_attempt="", body=b"", now_unix=NOW) is ok


@pytest.mark.parametrize(("ts", "ok"), [
    ("+1700000000", True),
    ("01700000000", True),
    ("1700000000.0", False),
    ("", False),
    ("+", False),
    ("++1700000000", False),
    ("1.7e9", False),
    ("0x6553f100", False),
    (" 1700000000", False),
    ("1700000000 ", False),
    ("1_700_000_000", False),
    ("\u0661\u0667\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660", False),  # Arabic-Indic digits
], ids=["plus-prefix", "leading-zero", "fraction", "empty", "plus-only", "double-plus", "exponent", "hex",
        "leading-space", "trailing-space", "underscores", "non-ascii-digits"])
def test_timestamp_must_be_a_decimal_integer(ts: str, ok: bool) -> None:
    """The signature is computed over the header text as sent, so each spelling is signed as-is."""
    v = VECTORS[0]
    sig = sign_request(SECRET, v["method"], v["target"], ts, "", "", b"")
    assert verify_request(SECRET, sig, method=v["method"], target=v["target"], timestamp=ts, dispatch_id="",
                          dispatch_attempt="", body=b"", now_unix=NOW) is ok


@pytest.mark.parametrize(("ts", "now", "ok"), [("-300", 0, True), ("+300", 0, True), ("-301", 0, False),
                                              ("-0", 0, True), ("-1700000000", NOW, False)],
                         ids=["minus-sign-in-window", "plus-sign-in-window", "minus-sign-outside", "minus-zero",
                              "negative-far-past"])
def test_timestamp_takes_an_optional_sign_like_go_parseint(ts: str, now: int, ok: bool) -> None:
    sig = sign_request(SECRET, "POST", "/x", ts, "", "", b"")
    assert verify_request(SECRET, sig, method="POST", target="/x", timestamp=ts, dispatch_id="",
                          dispatch_attempt="", body=b"", now_unix=now) is ok


@pytest.mark.parametrize("field", ["timestamp", "dispatch_id", "dispatch_attempt"])
@pytest.mark.parametrize("bad", ["\r", "\n", "\r\n"], ids=["cr", "lf", "crlf"])
def test_cr_or_lf_in_a_signed_header_fails_even_with_a_matching_signature(field: str, bad: str) -> None:
    v = VECTORS[2]  # heartbeat: has dispatch headers
    values = {"timestamp": TS, "dispatch_id": v["dispatch_id"], "dispatch_attempt": v["dispatch_attempt"]}
    values[field] += bad
    # An attacker-chosen value with an embedded line break signs to a well-formed HMAC.
    sig = sign_request(SECRET, v["method"], v["target"], values["timestamp"], values["dispatch_id"],
                       values["dispatch_attempt"], b"")
    assert not verify_request(SECRET, sig, method=v["method"], target=v["target"], body=b"", now_unix=NOW,
                              **values)


def test_line_break_would_let_fields_shift_between_headers() -> None:
    """Why CR/LF are refused: moving a "\n" across a header boundary signs the very same message
    (dispatch id "d\n3" + attempt "" ≡ dispatch id "d" + attempt "3\n"), so both are refused even
    though the HMAC matches."""
    shifted = signature_message("POST", "/x", TS, "d\n3", "", b"")
    assert shifted == signature_message("POST", "/x", TS, "d", "3\n", b"")
    sig = sign_request(SECRET, "POST", "/x", TS, "d\n3", "", b"")
    for did, att in (("d\n3", ""), ("d", "3\n")):
        assert not verify_request(SECRET, sig, method="POST", target="/x", timestamp=TS, dispatch_id=did,
                                  dispatch_attempt=att, body=b"", now_unix=NOW)


# -- webhook signature (outbound) ---------------------------------------------------------------


def test_webhook_signature() -> None:
    body = b'{"execution_id":"e","dispatch_id":"d","dispatch_attempt":1,"lease_timeout_seconds":120}'
    want = "sha256=" + hmac.new(b"test-secret", body, hashlib.sha256).hexdigest()
    assert webhook_signature("test-secret", body) == want
    assert verify_webhook_signature("test-secret", want, body)
    assert not verify_webhook_signature("test-secret", want, body + b" ")
    assert not verify_webhook_signature("other", want, body)
    assert not verify_webhook_signature("test-secret", want.upper(), body)
    assert not verify_webhook_signature("test-secret", "v1=" + want[7:], body)
    assert webhook_signature("test-secret", b"") == "sha256=" + hmac.new(b"test-secret", b"", hashlib.sha256).hexdigest()


# -- over real HTTP ---------------------------------------------------------------------------------


def _headers(running: Running, method: str, path: str, ts: str, did: str = "", att: str = "",
             body: bytes = b"") -> dict[str, str]:
    h = {"Rebuno-Agent-Id": running.agent_id, "Rebuno-Timestamp": ts,
         "Rebuno-Signature": sign(running.secret, method, path, ts, did, att, body)}
    if did:
        h["Rebuno-Dispatch-Id"] = did
    if att:
        h["Rebuno-Dispatch-Attempt"] = att
    return h


def _duplicated(name: str) -> Callable[[dict[str, str]], list[tuple[str, str]]]:
    return lambda h: [*h.items(), (name, h[name])]


# (case id, how the well-signed headers are changed, expected status). `ts` rewrites the timestamp
# and re-signs, so only the timestamp rule can fail; the others tamper after signing.
HTTP_CASES: list[tuple[str, Callable[[int], str] | None, Callable[[dict[str, str]], Any] | None, int]] = [
    ("good", None, None, 204),
    ("plus-prefixed-timestamp", lambda now: f"+{now}", None, 204),
    ("fractional-timestamp", lambda now: f"{now}.0", None, 401),
    ("empty-timestamp", lambda now: "", None, 401),
    ("stale-301s", lambda now: str(now - 301), None, 401),
    ("future-400s", lambda now: str(now + 400), None, 401),
    ("uppercase-hex", None, lambda h: dict(h, **{"Rebuno-Signature": "v1=" + h["Rebuno-Signature"][3:].upper()}), 401),
    ("old-sha256-format", None, lambda h: dict(h, **{"Rebuno-Signature": "sha256=" + "0" * 64}), 401),
    ("unknown-agent-is-401-not-404", None, lambda h: dict(h, **{"Rebuno-Agent-Id": "nobody"}), 401),
    ("duplicate-timestamp", None, _duplicated("Rebuno-Timestamp"), 401),
    ("duplicate-dispatch-id", None, _duplicated("Rebuno-Dispatch-Id"), 401),
    ("duplicate-dispatch-attempt", None, _duplicated("Rebuno-Dispatch-Attempt"), 401),
    ("duplicate-signature", None, _duplicated("Rebuno-Signature"), 401),
]


def test_http_route_applies_the_signature_rules(server: ServerThread, running: Running) -> None:
    """One live heartbeat route, every rule above end to end (one server for the whole table)."""
    eid, did, att = running.start()
    path = f"/v0/executions/{eid}/heartbeat"
    now = int(time.time())
    with httpx.Client(base_url=server.url, timeout=10) as c:
        for case, ts, tamper, want in HTTP_CASES:
            headers: Any = _headers(running, "POST", path, ts(now) if ts else str(now), did, str(att))
            if tamper:
                headers = tamper(headers)
            r = c.post(path, headers=headers)
            assert r.status_code == want, (case, r.text)
            if want == 401:
                assert r.json()["code"] == "unauthorized", case
