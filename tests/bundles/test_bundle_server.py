"""Bundles pulled from a real bundle server process over loopback: polling with ETag /
If-None-Match, activation through the load gate, and the signature matrix (valid, tampered file,
wrong key, expired and absent signatures, wrong scope), where every refusal keeps the active
revision, is logged with its reason, and shows in /metrics and /v0/ready's details."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernel.api.app import create_app
from kernel.bundle_puller import BundlePuller, BundlePullerCollector, BundleSource
from kernel.core.agents import register_agent
from kernel.core.kernel import Kernel
from kernel.core.policies import active_policy, list_revisions
from kernel.policy.resolver import BundleResolver
from kernel.policy.signature import (
    SIGNATURES_FILE,
    VerificationKey,
    read_bundle_files,
    sign_bundle_files,
)
from kernel.store import SqlStore
from tests.policy.signing_keys import copy_bundle, keys_for
from tests.support import ServerThread

AGENT = "payments"
SERVER = Path(__file__).with_name("server.py")


class BundleServer:
    def __init__(self, root: Path):
        self.root = root
        (root / "bundles").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, str(SERVER), str(root)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not (root / "port").exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("bundle server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{(root / 'port').read_text()}"

    def publish(self, bundle_dir: Path, name: str = AGENT) -> None:
        tmp = self.root / "bundles" / f".{name}.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for f in sorted(bundle_dir.rglob("*")):
                if f.is_file():
                    tar.add(f, arcname="/" + f.relative_to(bundle_dir).as_posix())  # OPA's layout
        os.replace(tmp, self.root / "bundles" / f"{name}.tar.gz")

    def withdraw(self, name: str = AGENT) -> None:
        (self.root / "bundles" / f"{name}.tar.gz").unlink()

    def requests(self) -> list[dict[str, Any]]:
        path = self.root / "requests.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def bundle_server(tmp_path: Path) -> Iterator[BundleServer]:
    srv = BundleServer(tmp_path / "server")
    yield srv
    srv.stop()


def _pulled_kernel(store: SqlStore) -> Iterator[Kernel]:
    k = Kernel(store=store, policy=BundleResolver(store))
    register_agent(k, AGENT, "http://127.0.0.1:9/webhook", "s3cret", None, keep_policy=True)
    yield k
    k.policy.close()  # type: ignore[attr-defined]


@pytest.fixture
def pulled(sqlite_store: SqlStore) -> Iterator[Kernel]:
    yield from _pulled_kernel(sqlite_store)


@pytest.fixture
def pulled_any(store: SqlStore) -> Iterator[Kernel]:
    """`pulled` on each store (SQLite and the real PostgreSQL)."""
    yield from _pulled_kernel(store)


def bundle(tmp: Path, revision: str, *, sign: str | None = "RS256", n: int = 0, scope: str | None = "prod",
           claims: dict[str, Any] | None = None, threshold: int = 1000, key_id: str | None = "release") -> Path:
    """The payments Rego bundle at `revision`, signed (or not)."""
    b = copy_bundle(tmp / revision)
    manifest = json.loads((b / ".manifest").read_text())
    manifest["revision"] = revision
    (b / ".manifest").write_text(json.dumps(manifest))
    data = json.loads((b / "data.json").read_text())
    data["payments"]["approval_threshold"] = threshold
    (b / "data.json").write_text(json.dumps(data))
    if sign is not None:
        priv, _ = keys_for(sign, n)
        text = sign_bundle_files(read_bundle_files(b), priv, algorithm=sign, key_id=key_id, scope=scope,
                                 claims=claims)
        (b / SIGNATURES_FILE).write_text(text)
    return b


def source(srv: BundleServer, *, keys: tuple[VerificationKey, ...] = (), resource: str = f"{AGENT}.tar.gz",
           default_key_id: str | None = None) -> BundleSource:
    return BundleSource(AGENT, f"{srv.url}/bundles/{resource}", token="pull-token", min_delay=0.05,
                        max_delay=0.1, timeout=5, keys=keys, default_key_id=default_key_id)


def release_key() -> VerificationKey:
    return VerificationKey(keys_for("RS256")[1], "RS256", "release", "prod")


def test_polling_with_etag_activates_each_new_bundle_once(
        pulled: Kernel, bundle_server: BundleServer, tmp_path: Path) -> None:
    puller = BundlePuller(pulled, [source(bundle_server)])
    try:
        assert puller.ready()[0] is False  # nothing active yet
        bundle_server.publish(bundle(tmp_path, "r1", sign=None))
        assert puller.poll(AGENT)
        assert active_policy(pulled, AGENT).revision == "r1"
        assert puller.poll(AGENT) and puller.poll(AGENT)
        reqs = bundle_server.requests()
        assert [r["status"] for r in reqs] == [200, 304, 304]
        assert reqs[0]["if_none_match"] is None and reqs[1]["if_none_match"] == reqs[2]["if_none_match"]
        assert reqs[0]["authorization"] == "Bearer pull-token"
        assert len(list_revisions(pulled, AGENT)) == 1  # a 304 stores nothing
        bundle_server.publish(bundle(tmp_path, "r2", sign=None, threshold=50))
        assert puller.poll(AGENT)
        assert active_policy(pulled, AGENT).revision == "r2"
        assert bundle_server.requests()[-1]["status"] == 200
        assert sorted(r.revision for r in list_revisions(pulled, AGENT)) == ["r1", "r2"]
        st = puller.status[AGENT]
        assert st.downloads == {"activated": 2, "not_modified": 2}
        assert puller.ready()[0] is True
    finally:
        puller.close()


def test_the_background_poll_picks_up_a_new_bundle(
        pulled: Kernel, bundle_server: BundleServer, tmp_path: Path) -> None:
    bundle_server.publish(bundle(tmp_path, "r1", sign=None))
    puller = BundlePuller(pulled, [source(bundle_server)])
    puller.start()
    try:
        deadline = time.monotonic() + 20
        while puller.status[AGENT].active_revision != "r1" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert active_policy(pulled, AGENT).revision == "r1"
        while not any(r["status"] == 304 for r in bundle_server.requests()) and time.monotonic() < deadline:
            time.sleep(0.05)  # it keeps polling, with the ETag
        assert any(r["status"] == 304 for r in bundle_server.requests())
        bundle_server.publish(bundle(tmp_path, "r2", sign=None))
        while puller.status[AGENT].active_revision != "r2" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert active_policy(pulled, AGENT).revision == "r2"
    finally:
        puller.close()


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("tampered", "digest_mismatch"),
        ("added-file", "file_unsigned"),
        ("wrong-key", "signature_invalid"),
        ("expired", "signature_expired"),
        ("absent", "signature_missing"),
        ("wrong-scope", "scope_mismatch"),
        ("load-gate", "load_gate"),
    ],
    ids=lambda v: str(v),
)
def test_a_refused_bundle_keeps_the_active_revision(
        pulled: Kernel, bundle_server: BundleServer, tmp_path: Path, case: str, reason: str,
        caplog: pytest.LogCaptureFixture) -> None:
    puller = BundlePuller(pulled, [source(bundle_server, keys=(release_key(),))])
    app = create_app(pulled, dev=True)
    app.state.bundle_puller = puller
    app.state.metrics_registry.register(BundlePullerCollector(puller))
    try:
        bundle_server.publish(bundle(tmp_path, "good"))  # valid: activated
        assert puller.poll(AGENT)
        assert active_policy(pulled, AGENT).revision == "good"
        if case == "tampered":
            bad = bundle(tmp_path, "bad")
            (bad / "policy.rego").write_text((bad / "policy.rego").read_text() + "\n# changed after signing\n")
        elif case == "added-file":
            bad = bundle(tmp_path, "bad")
            (bad / "payments" / "extra").mkdir(parents=True)
            (bad / "payments" / "extra" / "data.json").write_text('{"more": 1}')
        elif case == "wrong-key":
            bad = bundle(tmp_path, "bad", n=1)
        elif case == "expired":
            bad = bundle(tmp_path, "bad", claims={"exp": int(time.time()) - 5})
        elif case == "absent":
            bad = bundle(tmp_path, "bad", sign=None)
        elif case == "wrong-scope":
            bad = bundle(tmp_path, "bad", scope="staging")
        else:  # signed correctly, but not a bundle the load gate accepts
            bad = copy_bundle(tmp_path / "bad")
            (bad / "policy.rego").write_text("package payments\n\ndecision := {\n")
            priv, _ = keys_for("RS256")
            (bad / SIGNATURES_FILE).write_text(sign_bundle_files(
                read_bundle_files(bad), priv, key_id="release", scope="prod"))
        bundle_server.publish(bad)
        with caplog.at_level(logging.WARNING, logger="kernel.bundles"):
            assert puller.poll(AGENT) is False
        assert active_policy(pulled, AGENT).revision == "good"  # never changes on a refusal
        assert len(list_revisions(pulled, AGENT)) == 1
        assert any(reason in r.getMessage() and "keeping revision good" in r.getMessage() for r in caplog.records)
        with ServerThread(app) as srv:
            ready = httpx.get(f"{srv.url}/v0/ready")
            metrics = httpx.get(f"{srv.url}/metrics").text
        assert ready.status_code == 200  # still serving the good revision
        detail = ready.json()["details"]["bundles"][AGENT]
        assert detail["active_revision"] == "good" and detail["last_error"]["reason"] == reason
        assert f'regent_bundle_refusals_total{{agent="{AGENT}",reason="{reason}"}} 1.0' in metrics
        assert f'regent_bundle_downloads_total{{agent="{AGENT}",outcome="refused"}} 1.0' in metrics
        # Refused again on the next poll (its ETag was never adopted), still the good revision.
        assert puller.poll(AGENT) is False and active_policy(pulled, AGENT).revision == "good"
        # A good bundle after it is activated, and clears the error.
        bundle_server.publish(bundle(tmp_path, "fixed"))
        assert puller.poll(AGENT) and active_policy(pulled, AGENT).revision == "fixed"
        assert puller.status[AGENT].last_error is None
    finally:
        puller.close()


def test_a_download_error_keeps_the_revision_and_an_unready_kernel_says_why(
        pulled: Kernel, bundle_server: BundleServer, tmp_path: Path) -> None:
    puller = BundlePuller(pulled, [source(bundle_server)])
    app = create_app(pulled, dev=True)
    app.state.bundle_puller = puller
    try:
        assert puller.poll(AGENT) is False  # 404: nothing published yet
        with ServerThread(app) as srv:
            ready = httpx.get(f"{srv.url}/v0/ready")
        assert ready.status_code == 503
        assert ready.json()["details"]["bundles"][AGENT]["last_error"]["reason"] == "download_error"
        bundle_server.publish(bundle(tmp_path, "r1", sign=None))
        assert puller.poll(AGENT)
        bundle_server.stop()  # the server goes away: connection refused
        assert puller.poll(AGENT) is False
        assert active_policy(pulled, AGENT).revision == "r1"
        assert puller.status[AGENT].last_error["reason"] == "download_error"  # type: ignore[index]
        assert puller.ready()[0] is True  # r1 keeps deciding
    finally:
        puller.close()
        bundle_server.proc = subprocess.Popen(["true"])  # the fixture's stop() has a process to end


def test_a_signed_bundle_is_refused_when_no_key_is_configured(
        pulled: Kernel, bundle_server: BundleServer, tmp_path: Path) -> None:
    puller = BundlePuller(pulled, [source(bundle_server)])
    try:
        bundle_server.publish(bundle(tmp_path, "r1"))
        assert puller.poll(AGENT) is False
        assert puller.status[AGENT].last_error["reason"] == "signature_unexpected"  # type: ignore[index]
    finally:
        puller.close()


def test_several_keys_are_picked_by_the_signatures_key_id(
        pulled_any: Kernel, bundle_server: BundleServer, tmp_path: Path) -> None:
    """As OPA's `keys` config: the signature's `kid` names the key it is checked with (a key
    rotation keeps the old and the new key configured), and a signature naming none is checked with
    the bundle's default key id."""
    keys = (VerificationKey(keys_for("RS256")[1], "RS256", "release-2026", "prod"),
            VerificationKey(keys_for("ES256")[1], "ES256", "release-2027", "prod"))
    puller = BundlePuller(pulled_any, [source(bundle_server, keys=keys, default_key_id="release-2026")])
    try:
        bundle_server.publish(bundle(tmp_path, "old-key", key_id="release-2026"))
        assert puller.poll(AGENT) and active_policy(pulled_any, AGENT).revision == "old-key"
        bundle_server.publish(bundle(tmp_path, "new-key", sign="ES256", key_id="release-2027"))
        assert puller.poll(AGENT) and active_policy(pulled_any, AGENT).revision == "new-key"
        bundle_server.publish(bundle(tmp_path, "no-kid", key_id=None))  # RS256: the default key
        assert puller.poll(AGENT) and active_policy(pulled_any, AGENT).revision == "no-kid"
        refusals = {
            "unknown-kid": (bundle(tmp_path, "unknown-kid", key_id="release-2025"), "key_unknown"),
            # The 2027 key id on a signature the 2027 key did not make (the RSA key made it).
            "swapped": (bundle(tmp_path, "swapped", key_id="release-2027"), "signature_invalid"),
            "no-kid-es": (bundle(tmp_path, "no-kid-es", sign="ES256", key_id=None), "signature_invalid"),
        }
        for bad, reason in refusals.values():
            bundle_server.publish(bad)
            assert puller.poll(AGENT) is False
            assert puller.status[AGENT].last_error["reason"] == reason  # type: ignore[index]
            assert active_policy(pulled_any, AGENT).revision == "no-kid"  # kept on every refusal
    finally:
        puller.close()


PAYMENTS_YAML = (Path(__file__).resolve().parents[2] / "bundles" / "payments.yaml").read_text()


def _publish_raw(srv: BundleServer, name: str, body: bytes) -> None:
    tmp = srv.root / "bundles" / f".{name}.tmp"
    tmp.write_bytes(body)
    os.replace(tmp, srv.root / "bundles" / name)


def test_a_plain_yaml_bundle_file_is_pulled_and_activated_as_yaml(
        pulled_any: Kernel, bundle_server: BundleServer) -> None:
    puller = BundlePuller(pulled_any, [source(bundle_server, resource="payments.yaml")])
    try:
        _publish_raw(bundle_server, "payments.yaml", PAYMENTS_YAML.encode())
        assert puller.poll(AGENT)
        active = active_policy(pulled_any, AGENT)
        assert active.kind == "yaml" and active.content == PAYMENTS_YAML
        assert puller.poll(AGENT) and bundle_server.requests()[-1]["status"] == 304
        # A YAML bundle that does not compile, and an empty body, keep the active revision.
        for body in (b"default_action: deny\nrules:\n  - id: x\n    then: {decision: maybe}\n", b"", b"\n  \n"):
            _publish_raw(bundle_server, "payments.yaml", body)
            assert puller.poll(AGENT) is False
            assert puller.status[AGENT].last_error["reason"] == "load_gate"  # type: ignore[index]
            assert active_policy(pulled_any, AGENT).revision == active.revision
    finally:
        puller.close()


def test_a_plain_yaml_bundle_is_refused_when_signatures_are_required(
        pulled: Kernel, bundle_server: BundleServer) -> None:
    puller = BundlePuller(pulled, [source(bundle_server, keys=(release_key(),), resource="payments.yaml")])
    try:
        _publish_raw(bundle_server, "payments.yaml", PAYMENTS_YAML.encode())
        assert puller.poll(AGENT) is False
        assert puller.status[AGENT].last_error["reason"] == "signature_missing"  # type: ignore[index]
    finally:
        puller.close()


def test_a_signed_tarball_holding_a_yaml_bundle_is_verified_and_activated_as_yaml(
        pulled_any: Kernel, bundle_server: BundleServer, tmp_path: Path) -> None:
    puller = BundlePuller(pulled_any, [source(bundle_server, keys=(release_key(),))])
    b = tmp_path / "yaml-bundle"
    b.mkdir()
    (b / "payments.yaml").write_text(PAYMENTS_YAML)
    priv, _ = keys_for("RS256")
    (b / SIGNATURES_FILE).write_text(sign_bundle_files(read_bundle_files(b), priv, key_id="release", scope="prod"))
    try:
        bundle_server.publish(b)
        assert puller.poll(AGENT)
        active = active_policy(pulled_any, AGENT)
        assert active.kind == "yaml" and active.content == PAYMENTS_YAML
        (b / "payments.yaml").write_text(PAYMENTS_YAML.replace("max_calls: 30", "max_calls: 3000"))
        bundle_server.publish(b)  # changed after signing
        assert puller.poll(AGENT) is False
        assert puller.status[AGENT].last_error["reason"] == "digest_mismatch"  # type: ignore[index]
        assert active_policy(pulled_any, AGENT).revision == active.revision
    finally:
        puller.close()


def test_a_tarball_that_arrives_decompressed_is_still_a_tarball(
        pulled: Kernel, bundle_server: BundleServer, tmp_path: Path) -> None:
    """A server that sends the .tar.gz with `Content-Encoding: gzip` has it decoded by the client:
    the body is then a plain tar, which must not be taken for a YAML bundle file."""
    import io

    b = bundle(tmp_path, "plain-tar", sign=None)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        for f in sorted(b.rglob("*")):
            if f.is_file():
                tar.add(f, arcname=f.relative_to(b).as_posix())
    _publish_raw(bundle_server, f"{AGENT}.tar.gz", buf.getvalue())
    puller = BundlePuller(pulled, [source(bundle_server)])
    try:
        assert puller.poll(AGENT), puller.status[AGENT].last_error
        assert active_policy(pulled, AGENT).kind == "rego" and active_policy(pulled, AGENT).revision == "plain-tar"
    finally:
        puller.close()


def test_a_bundle_server_trickling_its_body_is_cut_off_and_the_revision_kept(pulled: Kernel) -> None:
    # httpx's timeout is per read: a byte every 50 ms never trips a 0.3 s read timeout, and held
    # the one puller thread for as long as the server liked. The whole download is now bounded.
    import socket
    import threading

    sock = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = sock.accept()
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            for _ in range(400):  # at most 20 s
                if done.is_set():
                    break
                conn.sendall(b"x")
                time.sleep(0.05)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    src = BundleSource(AGENT, f"http://127.0.0.1:{sock.getsockname()[1]}/b.tar.gz", min_delay=0.05, max_delay=0.1,
                       timeout=0.3)
    puller = BundlePuller(pulled, [src])
    try:
        started = time.monotonic()
        assert puller.poll(AGENT) is False
        assert time.monotonic() - started < 10  # the old code read on for the server's 20 s
        err = puller.status[AGENT].last_error
        assert err is not None and err["reason"] == "download_error" and "took over 0.6s" in err["message"]
    finally:
        done.set()
        sock.close()
        puller.close()


def test_a_bundle_whose_revision_was_changed_behind_the_pullers_back_is_activated_again(
        pulled: Kernel, bundle_server: BundleServer, tmp_path: Path) -> None:
    """A 304 means the server's bundle did not change, not that it is still active here: a change
    made where the pull is not configured (another replica, the store itself) is undone at the
    next poll instead of standing until the server's bundle next changes."""
    from kernel.core.policies import store_policy

    puller = BundlePuller(pulled, [source(bundle_server)])
    try:
        bundle_server.publish(bundle(tmp_path, "r1", sign=None))
        assert puller.poll(AGENT) and puller.poll(AGENT)
        assert [r["status"] for r in bundle_server.requests()] == [200, 304]
        store_policy(pulled, AGENT, "yaml", "default_action: allow\nrules: []\n")  # this kernel pulls nothing
        assert active_policy(pulled, AGENT).kind == "yaml"
        assert puller.poll(AGENT)
        assert bundle_server.requests()[-1] == {**bundle_server.requests()[-1], "status": 200, "if_none_match": None}
        assert active_policy(pulled, AGENT).revision == "r1"
        assert puller.poll(AGENT) and bundle_server.requests()[-1]["status"] == 304  # settled again
    finally:
        puller.close()
