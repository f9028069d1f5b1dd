"""Trust (issue 12): the policy under training holds its session's base URL and nothing else.
Everything it can try with that URL (and with the capability in it as an API key) against a
real ``turnstile serve`` over real HTTP is refused, and nothing changes: checked afterwards
through the trainer's token."""

from __future__ import annotations

import re
import stat
import subprocess
import sys

import httpx
import openai
import pytest

from turnstile.auth import TOKEN_FILE, is_loopback

pytestmark = pytest.mark.integration


def _chat(base_url: str, text: str, **kw: object) -> None:
    client = openai.OpenAI(base_url=base_url, max_retries=0, **{"api_key": "unused", **kw})
    client.chat.completions.create(
        model="t", messages=[{"role": "user", "content": text}], max_tokens=2, seed=1
    )


def _state(ts, sids: list[str]) -> dict:
    """Everything the harness might have changed, read with the trainer's token."""
    out = {"sessions": ts.get("/v1/sessions?limit=1000")["data"], "admin": ts.get("/admin/status")}
    for sid in sids:
        out[sid] = (
            ts.get(f"/v1/sessions/{sid}"),
            ts.get(f"/v1/sessions/{sid}/calls"),
            ts.get(f"/v1/sessions/{sid}/trajectories"),
        )
    return out


def test_a_harness_holding_its_session_url_can_do_nothing_else(turnstile):
    ts = turnstile
    mine, victim = ts.session(role="attacker"), ts.session(role="victim")
    base = mine["base_url"]
    cap = base.rsplit("/s/", 1)[1].split("/")[0]
    assert cap.startswith("cap_") and mine["id"] not in base and len(cap) >= 40
    _chat(base, "hello")
    _chat(victim["base_url"], "hi")
    victim_call = ts.get(f"/v1/sessions/{victim['id']}/calls")["data"][0]["id"]
    before = _state(ts, [mine["id"], victim["id"]])

    u = ts.url
    refused: list[tuple[str, str, int]] = []
    harness = httpx.Client(timeout=30)
    credentials = [
        {},
        {"authorization": f"Bearer {cap}"},
        {"authorization": "Bearer unused"},
        {"authorization": f"Bearer {mine['id']}"},
        {"authorization": cap},
    ]
    for auth in credentials:
        attempts = []
        for sid in (mine["id"], victim["id"]):
            attempts += [
                ("POST", f"/v1/sessions/{sid}/rewards", {"reward": 1e308}),
                (
                    "POST",
                    f"/v1/sessions/{sid}/rewards",
                    {"rewards": {"correct": 1.0}, "call_id": victim_call},
                ),
                ("GET", f"/v1/sessions/{sid}", None),
                ("GET", f"/v1/sessions/{sid}/calls", None),
                ("GET", f"/v1/sessions/{sid}/trajectories", None),
                ("GET", f"/v1/sessions/{sid}/calls/{victim_call}/body", None),
                ("POST", f"/v1/sessions/{sid}/close", {"termination_reason": "x"}),
                ("DELETE", f"/v1/sessions/{sid}", None),
            ]
        attempts += [
            ("GET", "/v1/sessions", None),
            ("GET", f"/v1/sessions?group={victim['id']}", None),
            ("POST", "/v1/sessions", {"metadata": {}, "id": "planted"}),
            ("POST", "/admin/pause", {"mode": "abort"}),
            ("POST", "/admin/resume", {"weight_version": "666"}),
            ("GET", "/admin/status", None),
            ("GET", "/openapi.json", None),
            ("GET", "/metrics", None),
            # calls into another session: by its id in the path, by a near-miss key
            ("GET", f"/s/{victim['id']}/v1/models", None),
            (
                "POST",
                f"/s/{victim['id']}/v1/chat/completions",
                {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
            ),
            (
                "POST",
                f"/s/{cap[:-1]}/v1/chat/completions",
                {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
            ),
        ]
        if auth.get("authorization") != f"Bearer {cap}":  # no session of its own: none
            attempts.append(
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
            )
        for method, path, body in attempts:
            r = harness.request(method, u + path, json=body, headers=auth)
            refused.append((method, path, r.status_code))
            assert r.status_code in (401, 403, 404), (auth, method, path, r.status_code, r.text)
            assert "error" in r.json()
        for named in (victim["id"], "default", "planted"):
            r = harness.post(
                u + "/v1/chat/completions",
                headers={**auth, "x-session-id": named},
                json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
            )
            assert r.status_code in (401, 403), (auth, named, r.text)
    # Cross-site posts a browser page can send without asking: form and text bodies.
    for ctype, content in (
        ("text/plain", b'{"reward": 5}'),
        ("application/x-www-form-urlencoded", b"reward=5"),
        (
            "multipart/form-data; boundary=x",
            b'--x\r\nContent-Disposition: form-data; name="reward"\r\n\r\n5\r\n--x--\r\n',
        ),
        (None, b'{"mode": "abort"}'),
    ):
        headers = {"content-type": ctype} if ctype else {}
        for path in (
            f"/v1/sessions/{victim['id']}/rewards",
            "/admin/pause",
            f"/v1/sessions/{victim['id']}/close",
        ):
            r = harness.post(u + path, content=content, headers=headers)
            assert r.status_code in (401, 403, 415), (ctype, path, r.text)
        # even with the right key, a chat call must be JSON said to be JSON
        r = harness.post(
            base + "/chat/completions",
            headers=headers,
            content=b'{"messages": [{"role": "user", "content": "x"}]}',
        )
        assert r.status_code == 415, r.text
    # The trainer's token is not the capability's business, and the reverse: a chat call
    # with the trainer's token as a capability goes nowhere either.
    r = harness.post(
        u + f"/s/{ts.token}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 404
    assert len(refused) > 100

    after = _state(ts, [mine["id"], victim["id"]])
    assert after == before
    assert not [s for s in after["sessions"] if s["id"] in ("default", "planted")]
    assert after["admin"]["paused"] is False

    # What the capability does allow: its own session, by URL or as the API key.
    assert harness.get(base + "/models").status_code == 200
    assert (
        harness.get(u + "/v1/models", headers={"authorization": f"Bearer {cap}"}).status_code == 200
    )
    _chat(u + "/v1", "again", api_key=cap)
    _chat(u + "/v1", "and again", api_key=cap, default_headers={"x-session-id": mine["id"]})
    assert len(ts.get(f"/v1/sessions/{mine['id']}/calls")["data"]) == 3
    assert ts.get(f"/v1/sessions/{victim['id']}/calls") == after[victim["id"]][1]
    # the capability is a secret: never in the server's log
    assert cap not in ts.log.read_text(errors="replace")
    assert harness.get(u + "/health").status_code == 200  # probes stay open


def test_the_token_file_and_capabilities_survive_a_restart(turnstile):
    ts = turnstile
    path = ts.data / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == ts.token
    s = ts.session()
    _chat(s["base_url"], "before")
    token = ts.token
    ts.stop()
    ts.start()
    assert ts.token == token  # read back from the file, not regenerated
    key = s["base_url"].split("/s/")[1]
    assert ts.get(f"/v1/sessions/{s['id']}")["base_url"].split("/s/")[1] == key
    _chat(f"{ts.url}/s/{key}", "after")  # (the restarted server listens on another port)
    assert len(ts.get(f"/v1/sessions/{s['id']}/calls")["data"]) == 2
    # A token file others can read is refused, not used.
    ts.stop()
    path.chmod(0o644)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnstile.app.cli",
            "serve",
            "--engine-url",
            ts.engine_url,
            "--model",
            str(ts.model),
            "--data",
            str(ts.data),
            "--port",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "chmod 600" in proc.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--no-auth", "--host", "0.0.0.0"], "--no-auth with --host 0.0.0.0"),
        (["--no-auth", "--host", "::"], "--no-auth with --host ::"),
        (["--token", "short"], "at least 16"),
    ],
)
def test_refused_starts(tmp_path, args, message):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnstile.app.cli",
            "serve",
            "--engine-url",
            "http://127.0.0.1:1",
            "--model",
            "unused",
            "--data",
            str(tmp_path / "d"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "d" / TOKEN_FILE).exists()


def test_loopback_rule():
    assert is_loopback("127.0.0.1") and is_loopback("127.8.0.1") and is_loopback("::1")
    assert is_loopback("[::1]") and is_loopback("localhost")
    for host in ("0.0.0.0", "::", "10.0.0.1", "192.168.1.5", "no-such-host.invalid"):
        assert not is_loopback(host), host


def test_openapi_is_the_trainers_and_matches_the_routes(turnstile):
    """The served document describes exactly the routes the app serves (its Starlette route
    table, which the dialects' declared routes are part of), no more and no fewer."""
    from starlette.routing import Route

    from turnstile.server.app import ROUTES
    from turnstile.viewer.routes import viewer_routes  # mounted by wiring.py beside them

    r = httpx.get(turnstile.url + "/openapi.json")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    doc = turnstile.get("/openapi.json")
    assert doc["openapi"].startswith("3.1")

    def shape(path: str) -> str:  # the document names {sid} under /s/ {capability}
        return re.sub(r"\{[^}]+\}", "{}", path)

    described = {(m.upper(), shape(p)) for p, ops in doc["paths"].items() for m in ops}
    served = {
        (method, shape(route.path))
        for route in [*ROUTES, *viewer_routes(None)]
        if isinstance(route, Route)  # not the WebSocket catch-all (426)
        for method in route.methods or ()
        if method != "HEAD"  # Starlette adds it beside every GET
    }
    assert described == served
