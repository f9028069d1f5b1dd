"""Reporting: percentiles and Markdown tables, as the benchmarks print them."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    if title:
        lines.append(title)
    lines.append(
        "| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)) + " |"
    )
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        lines.append(
            "| "
            + " | ".join(
                c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(r, widths, strict=True)
            )
            + " |"
        )
    return "\n".join(lines)


def _numeric(s: str) -> bool:
    return bool(s) and (s[0].isdigit() or s[0] in "-+.") and s not in ("-",)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    return str(v)
