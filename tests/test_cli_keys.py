"""`regent keys create|list|revoke --db-url …`: straight on the store, before any server runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel.cli import main
from kernel.core import api_keys
from kernel.core.kernel import Kernel
from kernel.store import open_store


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_create_list_revoke_on_a_fresh_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path}/k.db"
    rc, out, err = _run(capsys, "keys", "create", "--name", "treasury-oncall", "--scope", "approvals:read",
                        "--scope", "approvals:write", "--expires-in", "720h", "--db-url", db)
    assert rc == 0
    token = out.strip()
    assert token.startswith("rbk_") and "shown once" in " ".join(err.split())
    rc, out, _ = _run(capsys, "keys", "list", "--json", "--db-url", db)
    [key] = json.loads(out)
    assert (key["name"], key["scopes"], key["created_by"]) == ("treasury-oncall", ["approvals:read", "approvals:write"], "cli")
    assert "expires_at" in key and "token" not in key and "secret_hash" not in key
    store = open_store(db)
    try:
        p = api_keys.token_principal(Kernel(store=store), token)
        assert p is not None and p.name == "treasury-oncall" and p.has("approvals:write") and not p.has("executions:read")
    finally:
        store.close()
    assert _run(capsys, "keys", "revoke", key["id"], "--db-url", db)[0] == 0
    assert json.loads(_run(capsys, "keys", "list", "--json", "--db-url", db)[1]) == []
    [revoked] = json.loads(_run(capsys, "keys", "list", "--all", "--json", "--db-url", db)[1])
    assert "revoked_at" in revoked
    store = open_store(db)
    try:
        assert api_keys.token_principal(Kernel(store=store), token) is None
    finally:
        store.close()


@pytest.mark.parametrize(("argv", "rc", "message"), [
    (["keys", "create", "--name", "x", "--scope", "root"], 1, "unknown scope(s) root"),
    (["keys", "create", "--name", " ", "--scope", "approvals:read"], 1, "name must be 1-200 characters"),
    (["keys", "create", "--name", "x", "--scope", "approvals:read", "--expires-in", "soon"], 2, "--expires-in"),
    (["keys", "revoke", "not-an-id"], 2, "not a key id"),
    (["keys", "revoke", "01a23eca-eb59-719f-b8c9-d07e55387a26"], 1, "not found"),
], ids=["unknown-scope", "empty-name", "bad-expiry", "bad-id", "unknown-id"])
def test_bad_input_is_a_message_and_an_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 argv: list[str], rc: int, message: str) -> None:
    got, _, err = _run(capsys, *argv, "--db-url", f"sqlite:///{tmp_path}/k.db")
    assert got == rc
    assert message in " ".join(err.split())


def test_keys_needs_a_database(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REGENT_DB_URL", raising=False)
    rc, _, err = _run(capsys, "keys", "list")
    assert rc == 2 and "--db-url" in err
