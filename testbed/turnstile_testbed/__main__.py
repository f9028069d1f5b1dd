"""``python -m turnstile_testbed provision | demo | audit-corpus`` (``./run test`` provisions,
``./run demo`` runs the demo): the repository's commands that need the test bed, kept out of
the installed ``turnstile`` command."""

from __future__ import annotations

import argparse


def provision_command(args: argparse.Namespace) -> None:
    from .provision import provision

    for k, v in provision().items():
        print(f"{k}: {v}")


def demo_command(args: argparse.Namespace) -> None:
    from .demo import run  # imported when asked for: it starts llama-server

    run(args)


def audit_corpus_command(args: argparse.Namespace) -> None:
    import turnstile_testbed as testbed
    from turnstile.chat.audit_corpus import corpus_table

    print(corpus_table(str(testbed.templates_dir()), str(testbed.models_dir())))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m turnstile_testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("provision", help="build/unpack llama-server, tokenizers, templates, models")
    t.set_defaults(func=provision_command)
    d = sub.add_parser(
        "demo", help="SmolLM2 on llama-server: a few sessions and a tool round, what was recorded"
    )
    d.add_argument("--data", help="record store directory (default: a temporary one)")
    d.add_argument(
        "--sessions",
        type=int,
        default=4,
        help="how many chat sessions to run before the tool round (default: 4)",
    )
    d.set_defaults(func=demo_command)
    c = sub.add_parser(
        "audit-corpus",
        help="audit every template of the test bed's corpus (llama.cpp's); print a Markdown "
        "table (docs/templates.md)",
    )
    c.set_defaults(func=audit_corpus_command)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
