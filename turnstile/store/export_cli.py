"""``turnstile export``: the command's options and what it prints."""

from __future__ import annotations

import argparse
import json
import sys

from .export import export
from .export_schema import FORMATS, PARTITIONS, TABLES
from .held import HoldOptions
from .store import Store
from .trajectories import MODES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data", default="turnstile-data", help="store directory (or .sqlite3 file) to read"
    )
    p.add_argument("--store", metavar="URL", help="read a PostgreSQL record store instead")
    p.add_argument("--out", required=True, help="directory to write the tables under")
    p.add_argument(
        "--format", choices=FORMATS, default="parquet", help="file format (default: parquet)"
    )
    p.add_argument(
        "--tables", default=",".join(TABLES), help="comma-separated subset of " + ",".join(TABLES)
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="merged",
        help="trajectories: one sample per root-to-leaf path, or per call",
    )
    p.add_argument(
        "--partition",
        choices=PARTITIONS,
        default="batch",
        help="file layout: one folder per batch, per group, or flat (default: batch)",
    )
    p.add_argument(
        "--batch", help="name of this export batch (e.g. step-000012); default: a UTC timestamp"
    )
    p.add_argument("--group", action="append", help="only this group (repeatable)")
    p.add_argument("--session", action="append", help="only this session (repeatable)")
    p.add_argument("--status", choices=["open", "closed"], help="only sessions with it")
    p.add_argument(
        "--unexported", action="store_true", help="only sessions no earlier export wrote"
    )
    p.add_argument(
        "--delete",
        action="store_true",
        help="delete the exported sessions from the store afterwards",
    )
    p.add_argument(
        "--vacuum", action="store_true", help="after --delete, shrink the store file (rewrites it)"
    )
    p.add_argument(
        "--with-bodies",
        action="store_true",
        help="add kept raw request/response bodies to the calls table",
    )
    p.add_argument(
        "--mask-stale-versions",
        action="store_true",
        help="trajectories: mask the tokens a version other than the call's last sampled "
        "(calls held across a weight sync; docs/weight_sync.md)",
    )
    p.add_argument(
        "--max-preemptions",
        type=int,
        metavar="N",
        help="trajectories: mask the whole completion of a call preempted more than N times",
    )
    p.add_argument(
        "--rows-per-file",
        type=int,
        default=100_000,
        help="rows per written file before starting the next (default: 100000)",
    )


def cli(args: argparse.Namespace) -> None:
    """``turnstile export``: prints a JSON summary of what was written."""
    if args.max_preemptions is not None and args.max_preemptions < 0:
        print("turnstile export: --max-preemptions must be >= 0", file=sys.stderr)
        raise SystemExit(2)
    hold = HoldOptions(args.mask_stale_versions, args.max_preemptions)
    try:
        result = export(
            args.store or args.data,
            args.out,
            fmt=args.format,
            tables=[t for t in args.tables.split(",") if t],
            mode=args.mode,
            partition=args.partition,
            batch=args.batch,
            session_ids=args.session,
            group_ids=args.group,
            status=args.status,
            unexported_only=args.unexported,
            delete=args.delete,
            include_bodies=args.with_bodies,
            rows_per_file=args.rows_per_file,
            hold=hold if hold.active else None,
        )
    except (ValueError, KeyError, FileExistsError) as exc:
        print(f"turnstile export: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    if args.delete and args.vacuum:
        st = Store(args.store or args.data)
        st.vacuum()
        st.close()
    print(json.dumps(result.summary(), indent=2))
