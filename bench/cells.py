"""How a measured number becomes a cell of REPORT.md's tables. report.py, backend_tables.py
and the fleet section in fleet.py format microseconds, optional derived numbers and
status shares alike; this is the one copy of each rule."""


def ms(us):
    """Microseconds as milliseconds, two decimals."""
    return f"{us / 1000:.2f}"


def num(value, fmt=".2f"):
    """A derived number, or "-" when a counter was missing."""
    return "-" if value is None else format(value, fmt)


def statuses(status):
    """{"200": 90, "503": 10} -> "200: 90%, 503: 10%"."""
    total = sum(status.values()) or 1
    return ", ".join(f"{code}: {100 * n / total:.0f}%" for code, n in sorted(status.items()))


def table(head, align, rows, cells):
    """A markdown table: the `head` and `align` lines, then `cells(row)` for each row."""
    return "\n".join([head, align, *(cells(r) for r in rows)])
