"""What a Turnstile server is built from, built in one place: engines (one, or a replica pool),
the record store, the gateway of either recording mode, and the app.

``turnstile serve`` builds from its options (:func:`server_from_args`); the demo, the tests and
the benchmarks call the builders directly. Nothing here runs a server.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..chat.audit import audit
from ..chat.patches import apply_patches
from ..chat.policy import Policy
from ..chat.render import Renderer
from ..chat.template import ChatTemplate
from ..chat.tokenizer import load_tokenizer
from ..chat.vision import image_expander
from ..engines import capture_kind, engine_kind, make_engine
from ..engines.base import Engine
from ..engines.capture import CaptureEngine, capture_engine
from ..engines.http import CONNECT_TIMEOUT_S, ENGINE_TIMEOUT_S
from ..engines.pool import ReplicaPool
from ..engines.prompt_json import PROMPTS
from ..gateway.capture.gateway import PassthroughGateway
from ..gateway.control import HoldLimits
from ..gateway.token_in.gateway import Gateway
from ..media import Limits as MediaLimits
from ..media import set_limits as set_media_limits
from ..media_fetch import check_prefix as check_url_prefix
from ..parsing.detect import FormatChoice, detect_format
from ..server.canary import attach as attach_canary
from ..server.limits import Limits
from ..server.monitor import VerifyOptions
from ..store.database import is_postgres
from ..store.store import Store

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ..server.peers import Peers


def engine_urls(args: list[str]) -> list[str]:
    """``--engine-url`` values: URLs, or ``@FILE`` naming a file of them (one a line)."""
    return [
        u
        for arg in args
        for u in (Path(arg[1:]).read_text().split() if arg.startswith("@") else [arg])
    ]


def detect_parser(template: ChatTemplate, tool_parser: str | None = None) -> FormatChoice:
    """Reasoning and tool-call parsing picked from what the template itself writes;
    ``tool_parser`` overrides the tool-call format ("none" turns it off)."""
    choice = detect_format(template.source)
    if tool_parser:
        choice = choice.with_tool_format(None if tool_parser == "none" else tool_parser)
    return choice


def build_renderer(
    model: str, chat_template: str | None = None, patches: bool = True
) -> tuple[Renderer, list[str]]:
    """Tokenizer + template (with declared repairs applied) for a model."""
    tok = load_tokenizer(model, chat_template)
    if not tok.chat_template:
        raise SystemExit(f"{model} has no chat template; pass --chat-template FILE")
    source, applied = apply_patches(tok.chat_template, patches)
    template = ChatTemplate(source, tok.special_tokens)
    return Renderer(tok, template), applied


def build_engine(kind: str, urls: str | list[str], options: dict | None = None) -> Engine:
    """The token-in adapter for one engine URL, or a replica pool over several."""
    urls = [urls] if isinstance(urls, str) else list(urls)
    replicas = [make_engine(kind, u, **(options or {})) for u in urls]
    return replicas[0] if len(replicas) == 1 else ReplicaPool(replicas)


def build_gateway(
    engine_url: str | list[str],
    model: str,
    data: str | Path,  # the store: a directory, an SQLite file or a postgresql:// URL
    chat_template: str | None = None,
    model_name: str | None = None,
    patches: bool = True,
    audit_template: bool = True,
    engine: str = "llama-cpp",
    engine_options: dict | None = None,
    keep_bodies: bool = False,
    tool_parser: str | None = None,
    synchronous: str = "full",
    max_trees: int = 1024,
    record_fields: dict | None = None,
    shared: bool = False,
    default_max_tokens: int | None = None,
) -> Gateway:
    """A token-in gateway: Turnstile renders every prompt and sends token IDs;
    ``record_fields`` go into every call's record (turnstile.app.ray: which replica wrote it);
    ``shared``: other gateways record into the same store (see :func:`server_from_args`)."""
    renderer, applied = build_renderer(model, chat_template, patches)
    adapter = build_engine(engine, engine_url, engine_options)
    tok = renderer.tok
    ends = adapter.end_ids(tok.tokenizer.get_vocab()) - tok.eog_token_ids
    if ends:  # what the engine also stops on is an end of turn to Turnstile too
        tok = dataclasses.replace(tok, eog_token_ids=tok.eog_token_ids | ends)
        renderer = Renderer(tok, renderer.template)
    if applied:
        renderer.fingerprint += "+" + "+".join(applied)
    renderer.images = image_expander(model)  # images: only a model with an image processor
    policy = audit(renderer).policy() if audit_template else Policy.permissive()
    name = model_name or Path(model).name
    store = Store(
        data, keep_bodies=keep_bodies, synchronous=synchronous, record_fields=record_fields
    )
    return Gateway(
        renderer,
        adapter,
        store,
        name,
        detect_parser(renderer.template, tool_parser),
        policy,
        max_trees=max_trees,
        shared=shared,
        default_max_tokens=default_max_tokens,
    )


def build_passthrough(
    engine_url: str | list[str],
    model_name: str,
    data: str | Path,
    dialect: str = "vllm",
    keep_bodies: bool = False,
    logprobs_mode: str | None = None,
    original_logprobs: bool = False,
    synchronous: str = "full",
    timeout: float = ENGINE_TIMEOUT_S,
    connect_timeout: float = CONNECT_TIMEOUT_S,
) -> PassthroughGateway:
    """An engine-rendered capture gateway in front of one engine, or a replica pool."""
    urls = [engine_url] if isinstance(engine_url, str) else list(engine_url)
    replicas: list[CaptureEngine] = [
        capture_engine(
            u,
            dialect,
            logprobs_mode=logprobs_mode,
            original_logprobs=original_logprobs,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )
        for u in urls
    ]
    engine = replicas[0] if len(replicas) == 1 else ReplicaPool(replicas)
    store = Store(data, keep_bodies=keep_bodies, synchronous=synchronous)
    return PassthroughGateway(engine, store, model_name)


def engine_options(args: argparse.Namespace) -> dict:
    """The token-in adapter's options from ``serve``'s flags."""
    given = {
        "timeout": args.engine_timeout,
        "connect_timeout": args.engine_connect_timeout,
        "api": args.vllm_api,
        "logprobs_mode": args.engine_logprobs_mode or None,
        "original_logprobs": args.sglang_original_logprobs or None,
        "routed_experts": getattr(args, "routed_experts", None),
    }
    takes = engine_kind(args.engine).options
    return {k: v for k, v in given.items() if k in takes and v is not None}


def limits_from(args: argparse.Namespace) -> Limits:
    return Limits(
        max_messages=args.max_messages,
        max_tools=args.max_tools,
        max_string=args.max_string_kb << 10,
        max_depth=args.max_depth,
    )


@dataclass
class Server:
    """A built server: its app, its gateway, and what to tell the operator at start."""

    app: Starlette
    gateway: Gateway | PassthroughGateway
    banner: list[str]


def server_from_args(
    args: argparse.Namespace,
    *,
    record_fields: dict | None = None,
    session_origin: Callable[[str], Awaitable[str | None]] | None = None,
    shared: bool = False,
    peers: Peers | None = None,
    peer_route: bool = False,
) -> Server:
    """``turnstile serve``'s server, in either mode (``args.trainer_token`` already set).
    turnstile.app.ray's replicas add ``record_fields`` (in every call's record),
    ``session_origin`` (where a session's base URL points, ``AppContext``) and ``shared``;
    ``turnstile serve --workers N`` (``turnstile.app.workers``) also ``peers`` (on its front)
    and ``peer_route`` (on every worker).

    Shared (turnstile.app.ray's replicas; any PostgreSQL store): other gateways write this store
    too, so a session's status and a cached call tree's call count are read from the store
    per call, and a session that moves to this gateway continues exactly from its last
    acknowledged call."""
    from ..server.app import create_app
    from ..viewer.routes import viewer_routes

    shared = shared or is_postgres(args.store or "")

    urls = engine_urls(args.engine_url)
    gateway: Gateway | PassthroughGateway
    if args.mode == "passthrough":  # the engine renders; no tokenizer or template here
        dialect = capture_kind(args.engine).capture
        assert dialect is not None  # capture_kind refused it otherwise
        gateway = build_passthrough(
            urls,
            args.served_model_name or args.model,
            args.store or args.data,
            dialect,
            keep_bodies=args.keep_bodies,
            logprobs_mode=args.engine_logprobs_mode,
            original_logprobs=args.sglang_original_logprobs,
            synchronous=args.synchronous,
            timeout=args.engine_timeout,
            connect_timeout=args.engine_connect_timeout,
        )
        banner = [
            f"passthrough capture ({dialect} token-ID fields), model "
            f"{gateway.model_name}, engine at {', '.join(urls)}, records in "
            f"{gateway.store.location}"
        ]
    else:
        gateway = build_gateway(
            urls,
            args.model,
            args.store or args.data,
            args.chat_template,
            args.served_model_name,
            patches=not args.no_template_patches,
            engine=args.engine,
            engine_options=engine_options(args),
            keep_bodies=args.keep_bodies,
            tool_parser=args.tool_parser,
            synchronous=args.synchronous,
            max_trees=args.max_trees,
            record_fields=record_fields,
            shared=shared,
            default_max_tokens=args.default_max_tokens or None,
        )
        p = gateway.parser
        banner = [
            f"model {gateway.model_name} (template {gateway.renderer.fingerprint}), "
            f"engine {args.engine} at {', '.join(urls)}, records in {gateway.store.location}",
            f"parsing {p.family or 'plain text'}: tool calls {p.tool_format}, "
            f"reasoning {p.reasoning_tags if p.reasoning else 'off'}",
            f"encoding with {gateway.tok.encoder}",
            *gateway.policy.describe(),
        ]
    gateway.control.hold_limits = HoldLimits(  # serve --hold-* (docs/weight_sync.md)
        getattr(args, "hold_preemptions", 3),
        getattr(args, "hold_timeout", 600.0),
        getattr(args, "hold_stream", False),
    )
    PROMPTS.max_bytes = args.prompt_cache_mb << 20  # one per process (engines/prompt_json.py)
    set_media_limits(  # one per process, as PROMPTS (turnstile/media.py)
        MediaLimits(
            max_image_bytes=int(getattr(args, "max_image_mb", 10) * (1 << 20)),
            max_images_per_request=getattr(args, "max_images_per_request", 16),
            max_images_per_session=getattr(args, "max_images_per_session", 256),
            url_allow=tuple(
                check_url_prefix(p) for p in getattr(args, "image_url_allow", None) or ()
            ),
            url_timeout=getattr(args, "image_url_timeout", 10.0),
        )
    )
    public = args.public_url or f"http://{args.host}:{args.port}"
    app = create_app(
        gateway,
        public,
        max_body=args.max_body_mb << 20,
        token=args.trainer_token,
        limits=limits_from(args),
        tokenizer=None if isinstance(gateway, PassthroughGateway) else gateway.renderer.tok,
        keepalive=args.keepalive,
        verify=verify_options(args),
        session_origin=session_origin,
        shared=shared,
        peers=peers,
        peer_route=peer_route,
        # the viewer sits above the HTTP edge: mounted here, where the app is composed
        mounted=viewer_routes(gateway.model_name),
    )
    if isinstance(gateway, Gateway) and attach_canary(
        gateway.store, gateway.renderer, getattr(args, "canary_fraction", 0.0), app.state.metrics
    ):
        banner.append(f"drift canary on {args.canary_fraction:g} of calls (/metrics, sessions)")
    return Server(app, gateway, banner)


def verify_options(args: argparse.Namespace) -> VerifyOptions | None:
    """The live monitor's settings (token-in mode only: capture mode's prompts are the
    engine's own render, scored by the same recompute all the same)."""
    if not args.verify_fraction:
        return None
    return VerifyOptions(
        args.verify_fraction,
        engine_kind(args.engine).name,
        args.verify_engine_url,
        args.verify_threshold,
    )
