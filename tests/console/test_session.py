"""The console's session cookie and CSRF token, without a browser."""

from __future__ import annotations

import base64
import time

from kernel.console.session import Sessions


def test_a_cookie_verifies_only_unchanged_and_under_the_key_that_signed_it() -> None:
    s = Sessions(b"k" * 32, 60)
    cookie = s.encode(s.issue("key-id"))
    assert s.verify(cookie) is not None and s.verify(cookie).who == "key-id"  # type: ignore[union-attr]
    body, _, mac = cookie.partition(".")
    raw = base64.urlsafe_b64decode(mac + "=")
    for i in (0, len(raw) // 2, len(raw) - 1):  # a changed MAC byte, re-encoded canonically
        forged = raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:]
        assert s.verify(body + "." + base64.urlsafe_b64encode(forged).rstrip(b"=").decode()) is None
    assert s.verify(body[:-2] + "x." + mac) is None


def test_only_the_canonical_base64_of_a_cookie_verifies() -> None:
    # A 32-byte MAC is 43 characters whose last carries 2 spare bits: three other last characters
    # decoded to the same MAC (the old tamper test "changed" one 6.5 % of the time and passed
    # through), and the decoder also skipped characters outside the alphabet.
    s = Sessions(b"k" * 32, 60)
    cookie = s.encode(s.issue("key-id"))
    body, _, mac = cookie.partition(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    i = alphabet.index(mac[-1])
    for spare in (1, 2, 3):
        twin = mac[:-1] + alphabet[i ^ spare]
        assert base64.urlsafe_b64decode(twin + "=") == base64.urlsafe_b64decode(mac + "=")
        assert s.verify(body + "." + twin) is None
    assert s.verify(body + "." + mac[:10] + "!" + mac[10:]) is None
    assert s.verify(body[:5] + "\n" + body[5:] + "." + mac) is None
    assert Sessions(b"o" * 32, 60).verify(cookie) is None
    assert s.verify("") is None and s.verify("no-dot") is None and s.verify("a" * 2000 + ".b") is None


def test_an_expired_cookie_is_refused() -> None:
    s = Sessions(b"k" * 32, 60)
    session = s.issue("key-id")
    old = type(session)(session.who, int(time.time()) - 1, session.nonce)
    assert s.verify(s.encode(old)) is None


def test_the_csrf_token_is_bound_to_one_session() -> None:
    s = Sessions(b"k" * 32, 60)
    one, two = s.issue("a"), s.issue("a")
    assert s.csrf_ok(one, s.csrf(one))
    assert not s.csrf_ok(one, s.csrf(two))
    assert not s.csrf_ok(one, None) and not s.csrf_ok(one, "")


def test_without_a_configured_key_each_process_makes_its_own() -> None:
    a, b = Sessions(None, 60), Sessions(None, 60)
    assert a.verify(b.encode(b.issue("x"))) is None
