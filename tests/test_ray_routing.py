"""The routing key of turnstile.app.ray's request router, from what a harness really sends: the
openai client's own request (base URL with the capability, or the capability as its API key),
read back as the ASGI scope Serve's proxy hands the router."""

from __future__ import annotations

import pickle
import string

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.serve._private.common import StreamingHTTPRequest  # pinned: fails, not skips

from turnstile.app.ray.routing import request_scope, session_key

pytestmark = pytest.mark.unit

CAP = st.text(string.ascii_letters + string.digits + "-_", min_size=43, max_size=43).map(
    lambda s: "cap_" + s
)


def sent(base_url: str, api_key: str, headers: dict | None = None) -> httpx.Request:
    """The request the official openai client sends for a chat completion."""
    got: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        got.append(req)
        return httpx.Response(400, json={"error": {"message": "stop here"}})

    oa = openai.OpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        default_headers=headers,
    )
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    return got[0]


def scope_of(req: httpx.Request) -> dict:
    """The scope as Serve's proxy pickles it for the replica (the router unpickles it)."""
    scope = {
        "type": "http",
        "path": req.url.path,
        "headers": [(k.lower(), v) for k, v in req.headers.raw],
    }
    arg = pickle.dumps(StreamingHTTPRequest(scope, proxy_actor_name="proxy"))
    out = request_scope(arg)
    assert out is not None
    return out


@settings(max_examples=50, deadline=None)
@given(cap=CAP, other=CAP)
def test_a_session_has_one_key_however_its_harness_reaches_it(cap: str, other: str):
    by_url = scope_of(sent(f"http://h:8000/s/{cap}/v1", "unused"))
    by_key = scope_of(sent("http://h:8000/v1", cap))
    for s in (by_url, by_key):
        assert session_key(s["path"], s["headers"]) == cap
    # the Anthropic SDK sends the capability as x-api-key
    assert session_key("/v1/messages", [(b"x-api-key", cap.encode())]) == cap
    # another session's capability is another key; the path's capability wins over a key
    assert session_key(scope_of(sent(f"http://h:8000/s/{other}/v1", cap))["path"], []) == other


def test_trainer_requests():
    named = scope_of(
        sent("http://h:8000/v1", "trainer-token-0123456789", {"X-Session-Id": "rollout-7"})
    )
    assert session_key(named["path"], named["headers"]) == "id:rollout-7"
    plain = scope_of(sent("http://h:8000/v1", "trainer-token-0123456789"))
    assert session_key(plain["path"], plain["headers"]) is None  # any replica
    assert request_scope(b"not a pickle") is None and request_scope(object()) is None


def test_the_app_has_the_router_and_the_bounds_asked_for():
    from turnstile.app.ray import build_app

    fixed = build_app({"mode": "token-in"}, replicas=3)._bound_deployment
    assert fixed.num_replicas == 3
    assert (
        fixed._deployment_config.request_router_config.request_router_class
        == "turnstile.app.ray.routing:SessionRouter"
    )
    scaled = build_app(
        {"mode": "token-in"}, min_replicas=2, max_replicas=6, target_ongoing=8
    )._bound_deployment._deployment_config
    bounds = scaled.autoscaling_config
    assert (bounds.min_replicas, bounds.max_replicas, bounds.target_ongoing_requests) == (2, 6, 8)
    with pytest.raises(ValueError, match="token-in"):
        build_app({"mode": "passthrough"})


def test_a_replica_asks_the_router_by_session_key():
    from types import SimpleNamespace

    from turnstile.app.ray.routing import SESSION_KWARG, SessionRouter

    router = object.__new__(SessionRouter)  # _routing_key reads only the request
    cap = "cap_" + "k" * 43
    asked = SimpleNamespace(args=[], kwargs={SESSION_KWARG: cap})
    assert router._routing_key(asked) == cap
    assert router._routing_key(None) is None


def test_where_a_direct_replica_listens():
    import ray

    from turnstile.app.ray.app import direct_host

    # a loopback --host keeps the replicas' ports on loopback (no driver node named: any)
    assert direct_host("127.0.0.1", {"driver_node": None}) == "127.0.0.1"
    # otherwise the replica's node address (not 0.0.0.0: an address a harness can dial)
    assert direct_host("0.0.0.0", {}) == ray.util.get_node_ip_address()
