"""``turnstile serve | demo | testbed | export``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .chat.render import Renderer
from .chat.template import ChatTemplate
from .chat.tokenizer import load_tokenizer
from .engines.llamacpp import LlamaCppEngine
from .server.gateway import Gateway, ParserConfig
from .store.sqlite import Store


def detect_parser(template: ChatTemplate) -> ParserConfig:
    """Pick reasoning/tool-call parsing from what the template itself writes."""
    src = template.source
    reasoning = "<think>" in src
    started = False
    if reasoning:
        try:
            gen = template.render([{"role": "user", "content": "x"}], add_generation_prompt=True)
            started = gen.rstrip().endswith("<think>")
        except ValueError:
            pass
    return ParserConfig(reasoning=reasoning,
                        tool_format="hermes" if "<tool_call>" in src else None,
                        reasoning_started=started)


def build_gateway(engine_url: str, model: str, data: str | Path, chat_template: str | None = None,
                  model_name: str | None = None) -> Gateway:
    tok = load_tokenizer(model, chat_template)
    template = ChatTemplate.for_tokenizer(tok)
    renderer = Renderer(tok, template)
    engine = LlamaCppEngine(engine_url)
    name = model_name or Path(model).name
    return Gateway(renderer, engine, Store(data), name, detect_parser(template))


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from .server.app import create_app

    gateway = build_gateway(args.engine_url, args.model, args.data, args.chat_template,
                            args.served_model_name)
    public = args.public_url or f"http://{args.host}:{args.port}"
    app = create_app(gateway, public, max_body=args.max_body_mb << 20)
    p = gateway.parser
    print(f"turnstile: model {gateway.model_name} (template {gateway.renderer.fingerprint}), "
          f"engine {args.engine} at {args.engine_url}, records in {args.data}\n"
          f"turnstile: parsing reasoning={p.reasoning} tools={p.tool_format}", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                loop="uvloop", http="httptools", access_log=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="turnstile", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway in front of an engine")
    s.add_argument("--engine", choices=["llama-cpp"], default="llama-cpp")
    s.add_argument("--engine-url", required=True)
    s.add_argument("--model", required=True,
                   help="GGUF file, Hugging Face model directory, or hub id in the local cache")
    s.add_argument("--chat-template", help="Jinja file overriding the model's template")
    s.add_argument("--served-model-name")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8400)
    s.add_argument("--public-url", help="base URL harnesses reach this server at")
    s.add_argument("--data", default="turnstile-data", help="directory for the record store")
    s.add_argument("--max-body-mb", type=int, default=32)
    s.add_argument("--log-level", default="warning")
    s.set_defaults(func=serve)

    d = sub.add_parser("demo", help="SmolLM2 on llama-server, a few sessions, what was recorded")
    d.add_argument("--data", help="record store directory (default: a temporary one)")
    d.add_argument("--sessions", type=int, default=4)
    d.set_defaults(func=lambda a: __import__("turnstile.demo", fromlist=["run"]).run(a))

    t = sub.add_parser("testbed", help="build/unpack llama-server, tokenizers, templates, models")
    t.set_defaults(func=lambda a: [print(f"{k}: {v}") for k, v in
                                   __import__("turnstile.testbed", fromlist=["x"])
                                   .provision().items()])

    e = sub.add_parser("export", help="write sessions to Parquet/JSONL for a trainer")
    from .store import export as export_mod

    export_mod.add_arguments(e)
    e.set_defaults(func=export_mod.cli)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
