"""Webhook URLs are bounded at registration: one the delivery client would refuse (past 2 048
characters, a control character, a bad port or host) is a 400 in the envelope from the API and a
named error in the manifest, and nothing is stored. Any URL accepted is one httpx can send to."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.core.agents import MAX_WEBHOOK_URL_CHARS, validate_webhook_url
from kernel.errors import ConfigError, ValidationError
from kernel.manifest import load_manifest
from tests.support import ServerThread


def url_of(length: int) -> str:
    head = "http://127.0.0.1:9/webhook?t="
    return head + "a" * (length - len(head))


def register(server: ServerThread, url: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v0/agents", json={"id": "long", "webhook_url": url, "secret": "s"})


@pytest.mark.parametrize("length", [MAX_WEBHOOK_URL_CHARS + 1, 64 * 1024, 1024 * 1024], ids=["bound+1", "64KiB", "1MiB"])
def test_a_webhook_url_past_the_bound_is_a_400_and_registers_nothing(server: ServerThread, length: int) -> None:
    r = register(server, url_of(length))
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "validation_error"
    assert f"at most {MAX_WEBHOOK_URL_CHARS} characters" in r.json()["message"]
    assert len(r.text) < 1000  # the refusal does not echo the URL back
    assert httpx.get(f"{server.url}/v0/agents/long").status_code == 404


def test_a_webhook_url_at_the_bound_is_accepted(server: ServerThread) -> None:
    r = register(server, url_of(MAX_WEBHOOK_URL_CHARS))
    assert r.status_code == 201, r.text
    assert r.json()["webhook_url"] == url_of(MAX_WEBHOOK_URL_CHARS)


@pytest.mark.parametrize("url", ["http://a:99999/w", "http://a:x/w", "http://a b/w", "http://a/\tw", "http:///w",
                                 "http://ab\u200b/w", "http://[zz]/w"],
                         ids=["port-range", "port-text", "space", "tab", "no-host", "bad-idna", "bad-ipv6"])
def test_a_webhook_url_the_client_cannot_send_to_is_a_400(server: ServerThread, url: str) -> None:
    r = register(server, url)
    assert r.status_code == 400 and r.json()["code"] == "validation_error", r.text


def test_the_manifest_refuses_a_webhook_url_past_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "regent.yaml"
    path.write_text(f"agents:\n  - id: a\n    webhook_url: {url_of(64 * 1024)}\n    secret: s\n")
    with pytest.raises(ConfigError) as exc:
        load_manifest(path, env={})
    assert f"{path}:2: agent 'a': webhook_url must be at most {MAX_WEBHOOK_URL_CHARS} characters" in exc.value.message


_HOST = st.one_of(st.text(min_size=0, max_size=20), st.sampled_from(["127.0.0.1", "[::1]", "example.com", "ü.de"]))
_PORT = st.one_of(st.just(""), st.integers(-5, 70000).map(lambda p: f":{p}"), st.text(max_size=6).map(lambda p: ":" + p))


@settings(max_examples=400, deadline=None)
@given(scheme=st.sampled_from(["http", "https", "HTTP", "ftp", ""]), host=_HOST, port=_PORT,
       path=st.text(max_size=40), pad=st.integers(0, 3000))
def test_every_webhook_url_registration_accepts_is_one_httpx_can_send_to(
        scheme: str, host: str, port: str, path: str, pad: int) -> None:
    url = f"{scheme}://{host}{port}/{path}" + "p" * pad
    try:
        validate_webhook_url(url)
    except ValidationError:
        return
    parsed = httpx.URL(url)  # the oracle: raises InvalidURL for what the client cannot send
    assert parsed.scheme in ("http", "https") and parsed.host
