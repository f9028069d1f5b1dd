"""``turnstile verify``: re-feed a store's trajectories to an engine and print how the recorded
logprobs agree with its recompute (``verify.compare``), beside their naive versions. Each
call is scored under its own recorded sampling and logprob mode; a call that cannot be (a
grammar, logits) is named with the reason, and its tokens counted as refused."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys

import httpx

from ..engines.kinds import ENGINE_KINDS, engine_kind


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="turnstile-data", help="the record store directory")
    p.add_argument("--store", metavar="URL", help="a PostgreSQL record store instead of --data's")
    p.add_argument(
        "--engine",
        default="llama-cpp",
        choices=[n for k in ENGINE_KINDS for n in (k.name, *k.aliases)],
    )
    p.add_argument("--engine-url", required=True, help="the engine that scores (same weights)")
    p.add_argument(
        "--session", action="append", default=[], help="a session id (repeat; default: all)"
    )
    p.add_argument("--group", help="the sessions of this group")
    p.add_argument("--limit", type=int, default=100, help="at most this many sessions")
    p.add_argument(
        "--model",
        help="GGUF / HF dir / hub id whose tokenizer builds the naive (re-tokenized) version "
        "of each trajectory (default: no naive comparison)",
    )
    p.add_argument(
        "--top-n",
        type=int,
        help="vLLM/SGLang: the alternatives asked per position to recompute a processed "
        "logprob (default 128, or the server's --max-logprobs when lower; more decide more "
        "tokens: docs/verification.md)",
    )
    p.add_argument(
        "--json", action="store_true", help="one JSON object per trajectory, then the summary"
    )


def _f(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.4g}"


def _routing_cells(ra) -> str:
    if ra is None:
        return f"{'-':>6} {'-':>7} {'-':>10}"
    at = "-" if ra.first_disagreement is None else f"{ra.first_disagreement}/L{ra.first_layer}"
    return f"{ra.rows:>6} {_f(ra.share):>7} {at:>10}"


def _routing_line(row: dict) -> str:
    """The summary's routing figures: rows compared, the share agreeing, per weight version."""
    ro = row.get("routing")
    diag = ", ".join(f"{n} {d}" for d, n in row.get("diagnosis", {}).items())
    if not ro:
        return f"; routing: none compared; diagnosis: {diag}"
    per = ", ".join(f"v{v} {_f(c['share'])}" for v, c in ro["by_version"].items())
    return (
        f"; routing: {ro['rows']} (token, layer) rows, {_f(ro['share'])} agree ({per}), "
        f"{ro['absent_recorded']} absent in the record, {ro['absent_refeed']} in the re-feed; "
        f"diagnosis: {diag}"
    )


def cli(args: argparse.Namespace) -> None:
    from ..chat.tokenizer import load_tokenizer
    from ..store.store import Store
    from .compare import summary, verify_sessions
    from .scorers import NotSupported

    kind = engine_kind(args.engine).name
    store = Store(args.store or args.data)
    sids = list(args.session)
    if not sids:
        sessions, _ = store.list_sessions(group_id=args.group, limit=args.limit)
        sids = [s["id"] for s in sessions]
    tok = load_tokenizer(args.model) if args.model else None
    try:
        results = asyncio.run(
            verify_sessions(store, kind, args.engine_url, sids, tok, top_n=args.top_n)
        )
    except NotSupported as exc:
        raise SystemExit(f"turnstile verify: {exc}") from None
    except httpx.HTTPError as exc:
        raise SystemExit(
            f"turnstile verify: the {kind} engine at {args.engine_url} did not answer: {exc!r}"
        ) from None
    rows = summary(results)
    if args.json:
        for r in results:
            print(json.dumps(r.to_json()))
        print(json.dumps({"summary": rows}))
        return
    print(
        f"{'trajectory':<30} {'tokens':>6} {'max|Δ|':>9} {'mean|Δ|':>9} {'KL':>9} {'parts at':>8}"
        f"   naive: {'differ':>6} {'max|Δ|':>9} {'KL':>9} {'parts at':>8}"
        f"   routing: {'rows':>6} {'agree':>7} {'differs at':>10}  diagnosis"
    )
    for r in results:
        e, n = r.exact, r.naive
        print(
            f"{r.trajectory_id:<30} {e.tokens:>6} {_f(e.max_abs):>9} {_f(e.mean_abs):>9} "
            f"{_f(e.kl):>9} {e.parted_at if e.parted_at is not None else '-':>8}"
            f"          {'yes' if r.naive_tokens_differ else 'no':>6} "
            f"{_f(n.max_abs) if n else '-':>9} {_f(n.kl) if n else '-':>9} "
            f"{(n.parted_at if n and n.parted_at is not None else '-'):>8}"
            f"            {_routing_cells(r.routing)}  {r.diagnosis}"
        )
    for r in results:
        for note in r.notes:
            print(f"{r.trajectory_id}: {note}", file=sys.stderr)
    for row in rows:
        ex, nv = row["exact"], row["naive"]
        print(
            f"{row['engine']} weights {row['weight_version']}: {row['trajectories']} trajectories, "
            f"exact: {ex['tokens']} tokens, max |Δ| {_f(ex['max_abs'])}, "
            f"mean {_f(ex['mean_abs'])}, KL {_f(ex['kl'])}, {ex['parted']} parted, "
            f"{ex['undecided']} tokens undecided, {ex['refused']} refused; "
            f"naive: {row['naive_tokens_differ']} re-tokenize differently, "
            f"max |Δ| {_f(nv['max_abs'])}, KL {_f(nv['kl'])}, {nv['parted']} parted"
            + _routing_line(row),
            file=sys.stderr,
        )
        for ver, c in row.get("by_version", {}).items():
            print(
                f"  sampled by {ver}: {c['tokens']} tokens, max |Δ| {_f(c['max_abs'])}, "
                f"mean {_f(c['mean_abs'])}, KL {_f(c['kl'])}, {c['parted']} parted",
                file=sys.stderr,
            )
