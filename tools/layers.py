"""Module layering check: no import cycles between the modules of any crate.

A reader should be able to follow each crate top-down; a cycle means two modules can only
be understood together. Reads `use crate::a::...` (and `crate::a::` paths in code) in every
`.rs` file of each crate's `src/`, maps a file to its top-level module, and fails listing
every cycle found. Test files (`*_tests.rs`, `tests/` folders) are left out: a test may
reach anywhere.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def module_of(src, path):
    """The top-level module a file belongs to (`lib`/`main` for the crate root)."""
    rel = path.relative_to(src)
    first = rel.parts[0]
    return first[:-3] if first.endswith(".rs") else first


def graph(src):
    edges = {}
    for path in sorted(src.rglob("*.rs")):
        if path.name.endswith("_tests.rs") or "tests" in path.relative_to(src).parts[:-1]:
            continue
        text = path.read_text()
        # Drop `#[cfg(test)] mod tests { ... }` bodies at the end of a file.
        text = text.split("#[cfg(test)]\nmod tests {")[0]
        text = re.sub(r"//.*", "", text)
        here = module_of(src, path)
        for target in USE.findall(text):
            if target != here:
                edges.setdefault(here, set()).add(target)
    return edges


def cycles(edges):
    """Every elementary cycle's smallest rotation, found by depth-first search."""
    found = set()

    def visit(node, path, on_path):
        for nxt in sorted(edges.get(node, ())):
            if nxt in on_path:
                cycle = path[path.index(nxt):]
                i = cycle.index(min(cycle))
                found.add(tuple(cycle[i:] + cycle[:i]))
            elif len(path) < 12:
                visit(nxt, path + [nxt], on_path | {nxt})

    for start in sorted(edges):
        visit(start, [start], {start})
    return sorted(found)


def main():
    failed = False
    for cargo in sorted(ROOT.glob("*/Cargo.toml")):
        src = cargo.parent / "src"
        if not src.is_dir():
            continue
        for cycle in cycles(graph(src)):
            failed = True
            print(f"{cargo.parent.name}: import cycle {' -> '.join(cycle + (cycle[0],))}")
    if failed:
        sys.exit(1)
    print("layers: no import cycles")


if __name__ == "__main__":
    main()
