"""``turnstile serve | audit-template | view | export | verify``."""

# The demo, the test bed's provisioning and the template-corpus audit are the repository's
# (testbed/, ``./run demo``, ``./run test``), not the installed command's.

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..chat.audit import audit
from ..chat.patches import apply_patches
from ..chat.render import Renderer
from ..chat.template import ChatTemplate
from ..chat.tokenizer import load_tokenizer
from ..engines import capture_kind
from . import serve_options
from .wiring import build_renderer, server_from_args


def audit_command(args: argparse.Namespace) -> None:
    import orjson

    from ..chat.audit import behaviour
    from ..chat.audit_corpus import stand_in

    if not args.model:
        raise SystemExit("audit-template: give a model or a .jinja template")
    if args.model.endswith(".jinja"):
        source = Path(args.model).read_text()
        if args.tokenizer:
            renderer, applied = build_renderer(
                args.tokenizer, args.model, not args.no_template_patches
            )
            added: list[str] = []
        else:
            if not args.stand_in:
                raise SystemExit(
                    "audit-template: a .jinja template needs --tokenizer MODEL, or --stand-in "
                    "VOCAB.gguf (a vocabulary given the template's markers)"
                )
            base = load_tokenizer(args.stand_in)
            source, applied = apply_patches(source, not args.no_template_patches)
            tok, added = stand_in(base, source)
            renderer = Renderer(tok, ChatTemplate(source, tok.special_tokens))
    else:
        renderer, applied = build_renderer(args.model, None, not args.no_template_patches)
        added = []
    report = audit(renderer, args.model, added)
    if args.json:
        print(
            orjson.dumps(
                {**report.to_json(), "patches": applied}, option=orjson.OPT_INDENT_2
            ).decode()
        )
        return
    print(
        f"template {args.model}  tokenizer {report.tokenizer}"
        + (f"  stand-in markers {added}" if added else "")
        + (f"  patches {applied}" if applied else "")
    )
    print(f"{'conversation':<18} {'variant':<6} {'append':<18} {'result':<9} detail")
    for s in report.steps:
        print(f"{s.conversation:<18} {s.variant:<6} {s.kind:<18} {s.status:<9} {s.detail[:90]}")
    print(f"tool results one by one: {report.tool_incremental}")
    for kind, what in behaviour(report).items():
        print(f"{kind}: {what}")
    for line in report.policy().describe():
        print(f"gateway: {line}")


def serve(args: argparse.Namespace) -> None:
    from ..auth import AuthSetupError, server_token
    from ..server.error_log import log_to_stderr
    from . import served

    try:  # before anything slow: a refused start fails at once
        if args.mode == "passthrough":
            capture_kind(args.engine)
        args.trainer_token, where = server_token(args.data, args.token, args.no_auth, args.host)
    except (AuthSetupError, ValueError) as exc:
        raise SystemExit(f"turnstile: refusing to start: {exc}") from None
    print(f"turnstile: {where}", file=sys.stderr)
    if args.workers < 1 or (args.workers > 1 and args.ray):
        raise SystemExit(
            "turnstile: refusing to start: --workers takes a count >= 1, and not with --ray "
            "(give Ray --ray-replicas)"
        )
    if args.ray:
        from .ray import serve_ray  # the ray extra

        serve_ray(args)
        return
    if args.workers > 1:
        from .workers import serve_workers

        serve_workers(args)
        return
    server = server_from_args(args)
    for line in server.banner:
        print(f"turnstile: {line}", file=sys.stderr)
    log_to_stderr(args.log_level)  # one line per error answered (server.error_log)
    served.run(
        server.app,
        server.gateway.control,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        grace=serve_options.grace(args.shutdown_grace),
    )


def view(args: argparse.Namespace) -> None:
    """The trajectory viewer over a record store alone (no engine, read-only)."""
    import uvicorn

    from ..auth import AuthSetupError, server_token
    from ..store.database import sqlite_path
    from ..store.store import Store
    from ..viewer.app import create_viewer_app

    if not args.store and not sqlite_path(args.data).is_file():
        raise SystemExit(
            f"turnstile view: no record store under {args.data} (give the --data "
            "directory turnstile serve wrote to)"
        )
    try:
        token, where = server_token(args.data, args.token, args.no_auth, args.host)
    except AuthSetupError as exc:
        raise SystemExit(f"turnstile: refusing to start: {exc}") from None
    print(f"turnstile: {where}", file=sys.stderr)
    try:
        tok = load_tokenizer(args.model) if args.model else None
    except ValueError as exc:
        raise SystemExit(f"turnstile view: --model: {exc}") from None
    public = f"http://{args.host}:{args.port}"
    store = Store(args.store or args.data)
    app = create_viewer_app(store, public, token=token, tokenizer=tok)
    print(
        f"turnstile: viewer (read-only) at {public}/ui over {store.location}"
        + ("" if tok else "; tokens shown as IDs (give --model for their text)"),
        file=sys.stderr,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


def build_parser() -> argparse.ArgumentParser:
    """Every command's options (``turnstile.app.ray`` builds its replicas' options from them)."""
    parser = argparse.ArgumentParser(prog="turnstile", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway in front of an engine")
    serve_options.add_arguments(s)
    s.set_defaults(func=serve)

    a = sub.add_parser(
        "audit-template",
        help="is this template prefix-preserving, token by "
        "token? (tool and user appends, with/without "
        "reasoning, parallel calls, truncation)",
    )
    a.add_argument(
        "model", nargs="?", help="GGUF / HF dir / hub id, or a .jinja file with --tokenizer"
    )
    a.add_argument(
        "--tokenizer",
        help="model to take the tokenizer from when auditing a .jinja file",
    )
    a.add_argument(
        "--stand-in",
        metavar="VOCAB",
        help="instead of --tokenizer: a vocabulary (e.g. a vocab-only GGUF) that stands in, "
        "given the template's markers as added tokens",
    )
    a.add_argument(
        "--no-template-patches", action="store_true", help="audit the template exactly as shipped"
    )
    a.add_argument("--json", action="store_true", help="print the audit as JSON")
    a.set_defaults(func=audit_command)

    v = sub.add_parser(
        "view", help="the trajectory viewer over a record store, read-only, without an engine"
    )
    v.add_argument(
        "--data",
        default="turnstile-data",
        help="the record store directory (default: ./turnstile-data)",
    )
    v.add_argument("--store", metavar="URL", help="a PostgreSQL record store instead of --data's")
    v.add_argument(
        "--model",
        help="GGUF / HF dir / hub id whose tokenizer decodes the tokens "
        "(default: tokens shown as IDs)",
    )
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    v.add_argument("--port", type=int, default=8401, help="port to listen on (default: 8401)")
    v.add_argument("--token", help="the trainer's token (default: as serve finds it)")
    v.add_argument(
        "--no-auth",
        action="store_true",
        help="no token asked (refused unless --host is a loopback address)",
    )
    v.add_argument(
        "--log-level", default="warning", choices=["debug", "info", "warning", "error", "critical"]
    )
    v.set_defaults(func=view)

    e = sub.add_parser("export", help="write sessions to Parquet/JSONL for a trainer")
    from ..store import export_cli as export_mod

    export_mod.add_arguments(e)
    e.set_defaults(func=export_mod.cli)

    r = sub.add_parser(
        "verify",
        help="re-feed recorded trajectories to an engine: recorded logprobs vs its recompute",
    )
    from ..verify import cli as verify_cli

    verify_cli.add_arguments(r)
    r.set_defaults(func=verify_cli.cli)

    return parser


if __name__ == "__main__":
    main()
