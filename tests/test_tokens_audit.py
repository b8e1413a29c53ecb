"""Tokens per person with a role, and the audit log, through the optimizer's real HTTP server."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from conftest import free_port, simulated_fleet
from pydantic import ValidationError

from agent.config import MqttSettings
from optimizer.commands.cli import main
from optimizer.decide.catalog import load_catalog
from optimizer.serve.audit import AuditLog
from optimizer.serve.config import ApiSettings, OptimizerConfig
from optimizer.serve.lifecycle import Lifecycle
from optimizer.serve.service import Optimizer
from optimizer.serve.tokens import Tokens
from optimizer.serve.web.api import parse_since
from optimizer.serve.web.app import WebServer

VIEWER, APPROVER, STRANGER = "view-" + "v" * 30, "approve-" + "a" * 30, "nobody-" + "n" * 30


def line(name: str, role: str, token: str) -> str:
    return f"{name} {role} sha256:{hashlib.sha256(token.encode()).hexdigest()}\n"


def tokens_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o640)
    return path


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample on /metrics (labels as written there, e.g. ``reason="role"``)."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for row in text.splitlines():
        if row.startswith(wanted + " "):
            return float(row.split()[-1])
    raise AssertionError(f"{wanted} not on /metrics")


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, settings: ApiSettings) -> AsyncIterator[tuple[str, str]]:
    """The demo fleet planned, its API on a free port; its base URL and a recommendation's id."""
    fleet, _ = simulated_fleet("demo", 8, windows=4)
    config = OptimizerConfig(mqtt=MqttSettings(port=free_port()))
    optimizer = Optimizer(config, load_catalog(), lifecycle=Lifecycle.in_state_dir(tmp_path / "state"))
    optimizer.fleet = fleet
    await optimizer.plan_once()
    server = WebServer(optimizer, settings)
    await server.start()
    rec = next(r for p in optimizer.plans.values() for r in p.recommendations)
    try:
        yield f"http://127.0.0.1:{server.port}", rec.id
    finally:
        await server.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_viewer_cannot_decide_an_approver_can_and_the_audit_names_them(tmp_path: Path) -> None:
    """Deliberate bugs caught: permit() skipped (the viewer's ack goes through: 200, not 403); the audit entry
    written with the client's X-Forwarded-For although no proxy is trusted (a client could name any address)."""
    path = tokens_file(tmp_path / "tokens", line("vera", "viewer", VIEWER) + line("bob", "approver", APPROVER))
    async with serving(tmp_path, ApiSettings(port=0, tokens_file=path)) as (base, rec_id):
        ack = f"{base}/api/v1/recommendations/{rec_id}/ack"
        forged = {"X-Forwarded-For": "203.0.113.9"}  # not from a trusted proxy: ignored
        async with aiohttp.ClientSession() as http:
            async with http.post(ack, headers=bearer(VIEWER)) as r:
                assert r.status == 403 and "vera is a viewer" in await r.text()
            async with http.post(ack, headers=bearer(APPROVER) | forged) as r:
                assert r.status == 200 and (await r.json())["state"] == "acknowledged"
            async with http.get(f"{base}/api/v1/whoami", headers=bearer(APPROVER)) as r:
                assert await r.json() == {"name": "bob", "role": "approver"}
            async with http.get(f"{base}/api/v1/audit") as r:
                assert r.status == 401  # the audit names people and addresses: a viewer's token at least
            async with http.get(f"{base}/api/v1/audit", headers=bearer(VIEWER)) as r:
                entries = (await r.json())["entries"]
            async with http.get(f"{base}/api/v1/audit?who=bob&limit=1", headers=bearer(VIEWER)) as r:
                page = await r.json()
            async with http.get(f"{base}/api/v1/audit?since=2100-01-01", headers=bearer(VIEWER)) as r:
                assert (await r.json())["entries"] == []  # nothing is recorded in the future
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
            workload = entries[0]["workload"]
            async with http.get(f"{base}/workload", params={"id": workload}) as r:
                console = await r.text()
    assert [(e["who"], e["action"], e["result"], e["where"]) for e in entries] == [
        ("bob", "ack", "ok", "127.0.0.1"),
        ("vera", "ack", "forbidden", "127.0.0.1"),
    ]
    assert entries[0]["target"] == rec_id and entries[0]["detail"] == "acknowledged" and workload
    assert [e["who"] for e in page["entries"]] == ["bob"] and page["next"] is not None
    assert metric(metrics, "fleetfit_api_auth_refused_total", 'reason="role"') == 1
    assert metric(metrics, "fleetfit_api_tokens", 'role="approver"') == 1
    assert metric(metrics, "fleetfit_api_shared_token") == 0
    decisions = console[console.index('id="decisions"') :]
    assert re.search(r"<td>bob</td><td>ack</td>", decisions) and "forbidden" in decisions


async def test_an_unknown_token_is_refused_and_a_reloaded_file_revokes_without_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deliberate bugs caught: refresh() never rereading the file (bob's token would still acknowledge after his
    line is gone); `fleetfit recommendations ack` on the optimizer's host leaving no audit entry."""
    path = tokens_file(tmp_path / "tokens", line("bob", "approver", APPROVER))
    async with serving(tmp_path, ApiSettings(port=0, tokens_file=path)) as (base, rec_id):
        ack = f"{base}/api/v1/recommendations/{rec_id}/ack"
        async with aiohttp.ClientSession() as http:
            async with http.post(ack, headers=bearer(STRANGER)) as r:
                assert r.status == 401
            async with http.post(ack) as r:
                assert r.status == 401
            async with http.get(f"{base}/api/v1/whoami", headers=bearer(APPROVER)) as r:
                assert r.status == 200
            tokens_file(path, "# bob left\n" + line("vera", "viewer", VIEWER))
            async with http.post(ack, headers=bearer(APPROVER)) as r:
                assert r.status == 401
            async with http.get(f"{base}/api/v1/whoami", headers=bearer(VIEWER)) as r:
                assert (await r.json())["name"] == "vera"
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
    assert metric(metrics, "fleetfit_api_auth_refused_total", 'reason="unknown_token"') == 2
    assert metric(metrics, "fleetfit_api_auth_refused_total", 'reason="no_token"') == 1
    # refused by the API, acknowledged from the shell by whoever may write the state file
    assert main(["recommendations", "--state-dir", str(tmp_path / "state"), "ack", rec_id]) == 0
    assert capsys.readouterr().out.strip() == f"{rec_id} acknowledged"
    trail = AuditLog(tmp_path / "state" / "fleetfit.db")
    (entry,) = trail.query()
    trail.close()
    assert entry.who.startswith("local:") and (entry.where, entry.action, entry.result) == ("local", "ack", "ok")


async def test_a_malformed_line_is_rejected_alone_and_the_old_shared_token_still_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Deliberate bugs caught: a bad line failing the whole file (bob's token would be refused); the shared token
    dropped when a tokens file is given (401 for it)."""
    caplog.set_level(logging.WARNING)
    text = (
        line("bob", "approver", APPROVER)
        + line("eve", "superuser", STRANGER)  # line 2: no such role
        + "carol approver sha256:not-hex\n"  # line 3: no hash
    )
    path = tokens_file(tmp_path / "tokens", text)
    settings = ApiSettings(port=0, tokens_file=path, token="old-shared-secret")
    async with serving(tmp_path, settings) as (base, rec_id), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/v1/recommendations/{rec_id}/dismiss", headers=bearer(APPROVER)) as r:
            assert r.status == 200
        reopen = f"{base}/api/v1/recommendations/{rec_id}/reopen"
        async with http.post(reopen, headers=bearer("old-shared-secret")) as r:
            assert r.status == 200 and (await r.json())["state"] == "new"
        reload = f"{base}/api/v1/tokens/reload"
        async with http.post(reload, headers=bearer(APPROVER)) as r:
            assert r.status == 403  # an admin's
        async with http.post(reload, headers=bearer("old-shared-secret")) as r:
            assert (await r.json())["tokens"] == {"approver": 1, "admin": 1}  # bob, and the shared token
        async with http.get(f"{base}/api/v1/audit", headers=bearer("old-shared-secret")) as r:
            entries = [e for e in (await r.json())["entries"] if e["action"] != "reload_tokens"]
        async with http.get(f"{base}/metrics") as r:
            metrics = await r.text()
    assert [(e["who"], e["action"]) for e in entries] == [("shared-token", "reopen"), ("bob", "dismiss")]
    # the file was read twice, at start and by the reload: each read counts its bad lines
    assert metric(metrics, "fleetfit_api_token_lines_rejected_total", 'reason="role"') == 2
    assert metric(metrics, "fleetfit_api_token_lines_rejected_total", 'reason="hash"') == 2
    assert metric(metrics, "fleetfit_api_shared_token") == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("line 2 rejected (role)" in m for m in said) and any("line 3 rejected (hash)" in m for m in said)
    assert any("shared token" in m and "shared-token" in m for m in said)
    assert not any("not-hex" in m for m in said)  # a hash field is never echoed: it could be a pasted token


async def test_reads_need_a_viewer_when_configured_and_a_trusted_proxy_names_the_client(tmp_path: Path) -> None:
    """Deliberate bugs caught: the read check skipped for console pages (the overview served without a token); the
    cookie accepted for a change (a page elsewhere could make the browser acknowledge)."""
    path = tokens_file(tmp_path / "tokens", line("vera", "viewer", VIEWER) + line("bob", "approver", APPROVER))
    settings = ApiSettings(port=0, tokens_file=path, read_requires_token=True, trusted_proxies=["127.0.0.0/8"])
    async with serving(tmp_path, settings) as (base, rec_id), aiohttp.ClientSession() as http:
        async with http.get(f"{base}/") as r:
            assert r.status == 401 and 'id="token-form"' in await r.text()
        async with http.get(f"{base}/api/v1/recommendations") as r:
            assert r.status == 401
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 503  # open (no broker here)
        async with http.get(f"{base}/", headers={"Cookie": f"fleetfit-token={VIEWER}"}) as r:
            assert r.status == 200
        async with http.get(f"{base}/api/v1/recommendations", headers=bearer(VIEWER)) as r:
            assert r.status == 200
        ack = f"{base}/api/v1/recommendations/{rec_id}/ack"
        async with http.post(ack, headers={"Cookie": f"fleetfit-token={APPROVER}"}) as r:
            assert r.status == 401
        via_proxy = bearer(APPROVER) | {"X-Forwarded-For": "198.51.100.7, 203.0.113.9, 127.0.0.2"}
        async with http.post(ack, headers=via_proxy) as r:
            assert r.status == 200
        async with http.get(f"{base}/api/v1/audit", headers=bearer(VIEWER)) as r:
            (entry,) = (await r.json())["entries"]
    # the proxies (127.0.0.0/8) appended the last address; the one before them is the client's
    assert entry["where"] == "203.0.113.9" and entry["who"] == "bob"


def test_a_tokens_file_others_can_read_is_refused_at_start_and_an_unreadable_one_keeps_the_last_good(
    tmp_path: Path,
) -> None:
    """Deliberate bugs caught: no permission check (a world-readable file accepted); a failed reread emptying the
    token set (bob locked out while the file is being fixed)."""
    path = tokens_file(tmp_path / "tokens", line("bob", "approver", APPROVER))
    path.chmod(0o644)
    with pytest.raises(ValidationError, match=r"tokens_file\n.*open to others \(mode 644\)"):
        ApiSettings(tokens_file=path)
    path.chmod(0o600)
    tokens = Tokens(path)
    assert tokens.holder(APPROVER) is not None
    path.write_text(line("vera", "viewer", VIEWER))
    path.chmod(0o666)  # rewritten, and opened to others by mistake
    found = tokens.holder(APPROVER)
    assert found is not None and found.name == "bob" and tokens.holder(VIEWER) is None
    assert tokens.problem is not None and "open to others" in tokens.problem
    path.chmod(0o600)
    assert tokens.holder(APPROVER) is None and tokens.holder(VIEWER) is not None and tokens.problem is None


def test_token_add_prints_a_fresh_token_once_and_keeps_only_its_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deliberate bugs caught: the token itself written to the file (anyone reading it could act as carol); a name
    ending in a line break accepted (its token is printed but never works: the line is split in two, both
    rejected)."""
    path = tmp_path / "tokens"
    assert main(["token", "add", "carol", "--role", "approver", "--file", str(path)]) == 0
    token = capsys.readouterr().out.strip()
    assert len(token) >= 40 and token not in path.read_text()
    assert path.read_text() == line("carol", "approver", token)
    assert path.stat().st_mode & 0o777 == 0o600
    found = Tokens(path).holder(token)
    assert found is not None and (found.name, found.role.value) == ("carol", "approver")
    assert main(["token", "add", "bad name", "--role", "viewer", "--file", str(path)]) == 2
    assert main(["token", "add", "dave\n", "--role", "admin", "--file", str(path)]) == 2
    assert capsys.readouterr().out == "" and path.read_text() == line("carol", "approver", token)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["token", "list", "--file", str(path)]) == 0


def test_the_audit_log_is_bounded(tmp_path: Path) -> None:
    """Deliberate bug caught: prune() deleting nothing past the most kept (the log grows without bound)."""
    trail = AuditLog(tmp_path / "fleetfit.db", retention_days=1, max_entries=10)
    for i in range(25):
        trail.add("ack", "bob", "127.0.0.1", f"r{i}", "ok", now=1000.0 + i)
    trail.prune(now=1000.0 + 25)
    kept = trail.query(limit=500)
    assert len(kept) == 10 and kept[0].target == "r24" and kept[-1].target == "r15"
    trail.prune(now=1000.0 + 86_400 + 20)  # a day after r20: older ones are past the retention
    assert [e.target for e in trail.query(limit=500)] == ["r24", "r23", "r22", "r21", "r20"]
    trail.close()


@pytest.mark.parametrize("since", ["nan", "NaN", "inf", "2024-13-01", "yesterday"])
def test_an_audit_since_that_is_no_time_is_refused_not_answered_empty(since: str) -> None:
    """``since=nan`` is a float to Python and NULL to SQLite, so the audit answered an empty page as if nothing had
    happened. Deliberate bug: parse_since returning whatever float() reads (nan and inf taken)."""
    with pytest.raises(web.HTTPBadRequest) as refused:
        parse_since(since)
    assert "give Unix seconds or an ISO 8601 date or time" in (refused.value.text or "")
    assert parse_since("1700000000.5") == 1_700_000_000.5
    assert parse_since("2023-11-14T22:13:20Z") == 1_700_000_000.0


@pytest.mark.parametrize(
    ("headers", "status", "said"),
    [
        ({"Cookie": "fleetfit-token=%C3%A9"}, 400, "the bearer token is not ASCII"),
        ({"Authorization": "Bearer \u00e9t\u00e9"}, 400, "the bearer token is not ASCII"),
        ({"Authorization": "Bearer " + "x" * 600}, 401, "a valid bearer token is required"),
    ],
)
def test_a_malformed_token_is_refused_in_words_that_fit_where_it_came_from(
    headers: dict[str, str], status: int, said: str
) -> None:
    """A console page's stale cookie that is not ASCII is refused as a token, not as an Authorization header the
    browser never sent, and counted malformed (deliberate bug caught: the sign-in page telling a browser user
    their Authorization header is not ASCII)."""
    from aiohttp.test_utils import make_mocked_request

    from optimizer.serve.tokens import Role
    from optimizer.serve.web.access import Access

    access = Access(ApiSettings(token="shared-" + "s" * 30))
    with pytest.raises(web.HTTPException) as refused:
        access.require(make_mocked_request("GET", "/", headers=headers), Role.VIEWER, cookie=True)
    assert (refused.value.status, (refused.value.text or "").strip()) == (status, said)
    assert access.refused == {"malformed": 1}


def test_an_entry_written_is_not_counted_unwritten_when_pruning_after_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning that fails after an entry is written (the state file locked, a full disk) leaves the entry recorded
    and counted as such (deliberate bug caught: the pruning error raised out of add(), so record() logs the entry
    as not written and counts it on fleetfit_audit_unrecorded_total though it is in the log)."""
    import sqlite3

    from optimizer.serve import audit

    trail = AuditLog(tmp_path / "fleetfit.db")

    def locked(self: AuditLog, now: float | None = None) -> int:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(audit, "_PRUNE_EVERY", 1)
    monkeypatch.setattr(AuditLog, "prune", locked)
    before = dict(audit.unrecorded)
    entry = audit.record("ack", "bob", "127.0.0.1", "r1", "ok", into=trail)
    assert entry is not None and [e.target for e in trail.query()] == ["r1"]
    assert dict(audit.unrecorded) == before
    trail.close()
