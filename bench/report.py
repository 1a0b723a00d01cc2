"""The report format the benchmarks share: a ratio table and one PASS/MISS line per target."""

from __future__ import annotations


def table(rows: list[tuple[str, str, str, str]], baseline: str) -> str:
    """Rows of (run, tokens/s, padding, ratio); the last column is headed 'vs <baseline>'."""
    header = ("run", "tokens/s", "padding", f"vs {baseline}")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    def fmt(r):
        return " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
    return "\n".join([fmt(header), "-+-".join("-" * w for w in widths), *map(fmt, rows)])


def target_line(targets: dict, label: str, key: str, value: float | None, shown: str) -> tuple[str, dict]:
    """targets[key] is (">=" or "<=", bound, bound as shown); value None means the run was skipped."""
    op, bound, shown_bound = targets[key]
    passed = None if value is None else value >= bound if op == ">=" else value <= bound
    verdict = "skipped" if passed is None else "PASS" if passed else "MISS"
    line = f"{label:<30} {shown if value is not None else '-':>8}   target {op} {shown_bound:<6} {verdict}"
    return line, {"value": value, "target": f"{op} {bound}", "pass": passed}
