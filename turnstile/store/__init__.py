"""Durable records (SQLite), stitching into trajectories, export to Parquet/JSONL."""
