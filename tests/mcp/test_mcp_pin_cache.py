"""The gateway's view of the kernel's tool pins: the kernel's last answer, kept in a file only to
start while the kernel is unreachable; fail closed (a tool approved nowhere is never pinned)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from kernel.mcp.pins import KernelPins, reportable

SHA_A, SHA_B = "a" * 64, "b" * 64


def answer(**approved: str) -> dict[str, Any]:
    return {"agent_id": "files", "tools": [{"tool": t, "state": "approved", "approved_sha256": s}
                                           for t, s in approved.items()] + [{"tool": "fs_new", "state": "new"}]}


async def unreachable(report: Any) -> httpx.Response:
    raise httpx.ConnectError("refused")


def answers(body: dict[str, Any], status: int = 200) -> Any:
    async def send(report: Any) -> httpx.Response:
        return httpx.Response(status, json=body)
    return send


def test_until_the_kernel_answers_the_manifest_pins_alone_are_approved(tmp_path: Path) -> None:
    pins = KernelPins(tmp_path / "pins.json", {"files": {"fs_read": SHA_A}})
    assert asyncio.run(pins.sync("files", unreachable, {})) is None
    assert pins.pinned("files", "fs_read") == SHA_A
    assert pins.pinned("files", "fs_new") is None  # fail closed: trust_new_tools is the kernel's to apply


def test_the_kernels_answer_replaces_the_manifest_and_is_kept_for_the_next_start(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    pins = KernelPins(path, {"files": {"fs_read": SHA_A}})
    assert asyncio.run(pins.sync("files", answers(answer(fs_read=SHA_B, fs_write=SHA_A)), {})) is True
    assert (pins.pinned("files", "fs_read"), pins.pinned("files", "fs_write")) == (SHA_B, SHA_A)
    assert pins.pinned("files", "fs_new") is None
    assert asyncio.run(pins.sync("files", answers(answer(fs_read=SHA_B, fs_write=SHA_A)), {})) is False

    restarted = KernelPins(path, {"files": {"fs_read": SHA_A}})
    assert asyncio.run(restarted.sync("files", unreachable, {})) is None
    assert (restarted.pinned("files", "fs_read"), restarted.pinned("files", "fs_write")) == (SHA_B, SHA_A)


def test_a_refused_or_garbled_answer_keeps_the_last_approvals(tmp_path: Path) -> None:
    pins = KernelPins(None, {})
    asyncio.run(pins.sync("files", answers(answer(fs_read=SHA_A)), {}))
    assert asyncio.run(pins.sync("files", answers({"code": "internal_error"}, 500), {})) is None
    assert asyncio.run(pins.sync("files", answers({"tools": "nonsense"}), {})) is None
    assert pins.pinned("files", "fs_read") == SHA_A


def test_an_unreadable_fallback_file_falls_back_to_the_manifest(tmp_path: Path) -> None:
    path = tmp_path / "pins.json"
    path.write_text("{not json")
    assert KernelPins(path, {"files": {"fs_read": SHA_A}}).pinned("files", "fs_read") == SHA_A


def test_a_hostile_name_or_an_oversized_definition_is_never_reported() -> None:
    assert reportable("fs_read", "read", "Read.", {"type": "object"})
    assert not reportable("x" * 201, "x", "", {})
    assert not reportable("fs_\u202ename", "name", "", {})  # not printable: a bidi override
    assert not reportable("fs_a", "a", "x" * (64 * 1024), {})
