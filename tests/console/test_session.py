"""The console's session cookie and CSRF token, without a browser."""

from __future__ import annotations

import time

from kernel.console.session import Sessions


def test_a_cookie_verifies_only_unchanged_and_under_the_key_that_signed_it() -> None:
    s = Sessions(b"k" * 32, 60)
    cookie = s.encode(s.issue("key-id"))
    assert s.verify(cookie) is not None and s.verify(cookie).who == "key-id"  # type: ignore[union-attr]
    body, _, mac = cookie.partition(".")
    assert s.verify(body + "." + mac[:-1] + ("A" if mac[-1] != "A" else "B")) is None
    assert s.verify(body[:-2] + "x." + mac) is None
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
