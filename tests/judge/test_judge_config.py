"""Where judges come from: REGENT_JUDGE_PROVIDER, the manifest's deployment-wide and per-agent
`judge_provider`, and `regent policy eval --judge`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from kernel.bootstrap import build_judge
from kernel.cli import main as cli_main
from kernel.config import Settings
from kernel.core.ports import NoJudge
from kernel.domain import JudgeAnswer, JudgeSpec, PolicyInput
from kernel.errors import ConfigError
from kernel.judge import HttpJudge
from kernel.judge.http_judge import CRITERIA, QUESTION
from kernel.manifest import load_manifest
from tests.judge.conftest import PROVIDER, JudgeServer

ENV = {"JUDGE_URL": "http://127.0.0.1:9", "JUDGE_TEST_KEY": "k"}


def _manifest(tmp_path: Path, top: str = "", agent: str = "") -> Path:
    shutil.copy(PROVIDER, tmp_path / "judge.yaml")
    (tmp_path / "other.yaml").write_text(PROVIDER.read_text().replace("/judge", "/other"))
    p = tmp_path / "regent.yaml"
    p.write_text(f"{top}agents:\n  - id: mail\n    webhook_url: http://127.0.0.1:1/w\n    secret: s\n{agent}"
                 "  - id: plain\n    webhook_url: http://127.0.0.1:2/w\n    secret: s\n")
    return p


def test_no_provider_anywhere_is_no_judge(tmp_path: Path) -> None:
    m = load_manifest(_manifest(tmp_path), {})
    assert isinstance(build_judge(Settings(), m, ENV), NoJudge)


def test_manifest_names_a_deployment_judge_and_a_per_agent_one(tmp_path: Path) -> None:
    m = load_manifest(_manifest(tmp_path, top="judge_provider: judge.yaml\n",
                                agent="    judge_provider: other.yaml\n"), {})
    judge = build_judge(Settings(), m, ENV)
    assert isinstance(judge, HttpJudge)
    assert judge.provider_for("mail").url == "http://127.0.0.1:9/other"  # type: ignore[union-attr]
    assert judge.provider_for("plain").url == "http://127.0.0.1:9/judge"  # type: ignore[union-attr]


def test_setting_wins_over_the_manifest_default(tmp_path: Path) -> None:
    m = load_manifest(_manifest(tmp_path, top="judge_provider: judge.yaml\n"), {})
    judge = build_judge(Settings(judge_provider=str(tmp_path / "other.yaml")), m, ENV)
    assert judge.provider_for("plain").url == "http://127.0.0.1:9/other"  # type: ignore[union-attr]


def test_missing_provider_file_names_the_manifest_line(tmp_path: Path) -> None:
    p = _manifest(tmp_path, agent="    judge_provider: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"regent\.yaml:5: agent 'mail': judge_provider 'nowhere.yaml' not found"):
        load_manifest(p, {})


def test_broken_provider_file_fails_start_up(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("url: http://x\nbody: '{{range .X}}'\nprobabilities: p\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: body: unsupported"):
        build_judge(Settings(judge_provider=str(bad)), None, {})


def test_policy_eval_takes_judge_probabilities(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = tmp_path / "b.yaml"
    b.write_text("rules:\n  - id: ask\n    when: {target: send_email}\n    then: {decision: judge}\n")
    assert cli_main(["policy", "eval", str(b), "--target", "send_email", "--judge", '{"allow": 0.8}']) == 0
    assert "allow  ask  judge: allow 0.80" in capsys.readouterr().out
    assert cli_main(["policy", "eval", str(b), "--target", "send_email"]) == 0
    assert "deny  ask  judge not configured" in capsys.readouterr().out
    assert cli_main(["policy", "eval", str(b), "--target", "send_email", "--judge", '{"allow": 3}']) == 1


def test_decision_log_masks_apply_to_what_the_judge_is_sent(judge_server: JudgeServer, tmp_path: Path) -> None:
    judge_server.set()
    provider = tmp_path / "judge.yaml"
    provider.write_text(PROVIDER.read_text())
    settings = Settings(judge_provider=str(provider), decision_log_mask="/args/password,/execution/input")
    judge = build_judge(settings, None, {"JUDGE_URL": judge_server.url, "JUDGE_TEST_KEY": "k"})
    inp = PolicyInput(agent_id="a", kind="tool_call", target="login", args={"user": "ada", "password": "hunter2"})

    async def ask() -> JudgeAnswer:
        try:
            return await judge.ask(JudgeSpec(), inp)  # type: ignore[no-any-return]
        finally:
            await judge.aclose()

    answer = asyncio.run(ask())
    assert answer.request is not None and answer.request["tool_call"]["arguments"] == {"user": "ada"}
    [seen] = judge_server.received()
    assert "hunter2" not in seen["body"] and '"user":"ada"' in seen["body"]
    assert inp.args["password"] == "hunter2"  # the step's own args are untouched


def _ask(judge: HttpJudge, spec: JudgeSpec, inp: PolicyInput) -> JudgeAnswer:
    async def ask() -> JudgeAnswer:
        try:
            return await judge.ask(spec, inp)
        finally:
            await judge.aclose()

    return asyncio.run(ask())


@pytest.mark.parametrize("variable", ["REGENT_JUDGE_API_KEY", "REBUNO_TYPESAFE_API_KEY"])
def test_an_api_key_alone_configures_the_upstream_typesafe_judge(
        variable: str, judge_server: JudgeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream's newest configuration (rebuno internal/policy/judge.go NewJudge): no provider file,
    an API key; the request is the body upstream marshals, with the key as a bearer token."""
    judge_server.set(probabilities={"deny": 0.8, "allow": 0.2})
    for name in ("REGENT_JUDGE_API_KEY", "REBUNO_TYPESAFE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "ts-key-1")
    monkeypatch.setenv("REGENT_JUDGE_URL", f"{judge_server.url}/judge")
    judge = build_judge(Settings(), None, dict(os.environ))
    assert isinstance(judge, HttpJudge)
    inp = PolicyInput(agent_id="bash-bot", kind="tool_call", target="bash", args={"command": "rm -rf /tmp/x", "n": 1.5})
    answer = _ask(judge, JudgeSpec(instructions="a disposable container"), inp)
    assert answer.probabilities == {"deny": 0.8, "allow": 0.2}
    [seen] = judge_server.received()
    assert seen["authorization"] == "Bearer ts-key-1"
    assert json.loads(seen["body"]) == {
        "model": "jev-latest",
        "state": {"tool_call": {"agent_id": "bash-bot", "tool": "bash", "arguments": {"command": "rm -rf /tmp/x", "n": 1.5}}},
        "questions": {"decision": {"type": "choice",
                                   "instructions": {"question": QUESTION, "note": "a disposable container"},
                                   "criteria": CRITERIA}},
    }


def test_without_instructions_the_typesafe_judge_sends_the_bare_question(judge_server: JudgeServer) -> None:
    judge_server.set()
    settings = Settings(judge_api_key="k2", judge_url=f"{judge_server.url}/judge")
    judge = build_judge(settings, None, {})
    _ask(judge, JudgeSpec(), PolicyInput(agent_id="a", kind="tool_call", target="t", args={}))
    [seen] = judge_server.received()
    assert json.loads(seen["body"])["questions"]["decision"]["instructions"] == QUESTION


def test_a_provider_file_wins_over_the_api_key(tmp_path: Path) -> None:
    shutil.copy(PROVIDER, tmp_path / "judge.yaml")
    judge = build_judge(Settings(judge_provider=str(tmp_path / "judge.yaml"), judge_api_key="k"), None, ENV)
    assert isinstance(judge, HttpJudge)
    provider = judge.provider_for("anyone")
    assert provider is not None and provider.url == "http://127.0.0.1:9/judge"


def test_the_regent_variable_wins_over_the_upstream_one() -> None:
    judge = build_judge(Settings(judge_api_key="regent-key"), None, {"REBUNO_TYPESAFE_API_KEY": "rebuno-key"})
    provider = judge.provider_for("a")
    assert provider is not None and dict(provider.headers) == {"Authorization": "Bearer regent-key"}
    assert provider.url == "https://api.typesafe.ai/v1/systemone"


def test_no_api_key_and_no_provider_still_means_no_judge() -> None:
    assert isinstance(build_judge(Settings(), None, {"REBUNO_TYPESAFE_API_KEY": ""}), NoJudge)
