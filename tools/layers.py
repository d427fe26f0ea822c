"""Module layering check: no import cycles between the modules of any crate, at any level.

A reader should be able to follow each crate top-down; a cycle means two modules can only
be understood together. Every `.rs` file of each crate's `src/` is a module (`glue/hub.rs`
is `glue::hub`); every path it names is read: `crate::a::b`, `super::x`, `self::x`, a bare
`x::` naming a child module, and grouped imports (`use crate::{a, b::{c, d}}`) expanded.
A reference from one module to another counts between the two children of their closest
common parent: `glue::hub` naming `glue::redis` is an edge `hub -> redis` inside `glue`,
`admission::conclusion` naming `rules` is `admission -> rules` at the top. Each folder's edges must be
free of cycles. Test files (`*_tests.rs`, `tests/` folders, a trailing `#[cfg(test)] mod
tests`) are left out: a test may reach anywhere.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# A path's first segment and what follows it: `crate::a::{b, c}::...`.
PATH_START = re.compile(rf"\b(crate|super|self|{IDENT})::")
MOD_DECL = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*;", re.M)


def module_path(src, path):
    """A file's module: `glue/hub.rs` -> ("glue", "hub"); `lib.rs`, `main.rs` -> ()."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts.pop()
    return tuple(parts)


def tree(text, at):
    """The paths of a use-tree starting at `text[at:]` (after `prefix::`), as lists of
    segments, and where it ends: `a::b`, `{a, b::{c, d}}`, `a::*`."""
    paths, i = [], at
    if text.startswith("{", i):
        i += 1
        while True:
            while i < len(text) and text[i] in " \t\n,":
                i += 1
            if i >= len(text) or text[i] == "}":
                return paths, i + 1
            sub, i = tree(text, i)
            paths.extend(sub)
    m = re.compile(IDENT).match(text, i)
    if not m:
        return [[]], i
    name, i = m.group(0), m.end()
    if text.startswith("::", i):
        rest, i = tree(text, i + 2)
        return [[name] + r for r in rest], i
    return [[name]], i


def references(text, here, children):
    """The modules `text` (of module `here`, whose child modules are `children`) names, as
    absolute paths (tuples of segments; maybe longer than a module path)."""
    found = []
    for m in PATH_START.finditer(text):
        start = m.group(1)
        if m.start() > 0 and text[m.start() - 1] == ":":
            continue  # the middle of a longer path, read with its start
        if start == "crate":
            base = ()
        elif start == "super":
            base = here[:-1]
        elif start == "self":
            base = here
        elif start in children:
            base = here + (start,)
        else:
            continue  # another crate, a type, an enum's variant
        paths, _ = tree(text, m.end())
        found.extend(base + tuple(p) for p in paths)
    return found


def graph(src):
    """Edges by folder: {parent module path: {child: {child, ...}}}."""
    files = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        if path.name.endswith("_tests.rs") or "tests" in rel.parts[:-1]:
            continue
        text = path.read_text()
        text = text.split("#[cfg(test)]\nmod tests {")[0]
        text = re.sub(r"//.*", "", text)
        text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
        files[module_path(src, path)] = text
    modules = set(files)
    edges = {}
    for here, text in files.items():
        children = {c for c in MOD_DECL.findall(text)}
        for target in references(text, here, children):
            # The longest prefix of the path that is a module of this crate.
            while target and target not in modules:
                target = target[:-1]
            if not target or target == here:
                continue
            common = 0
            while common < min(len(here), len(target)) and here[common] == target[common]:
                common += 1
            if common == len(here) or common == len(target):
                continue  # a module naming its own parent or child
            parent = here[:common]
            edges.setdefault(parent, {}).setdefault(here[common], set()).add(target[common])
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
        for parent, folder in sorted(graph(src).items()):
            where = "::".join(parent) or "crate"
            for cycle in cycles(folder):
                failed = True
                print(f"{cargo.parent.name} ({where}): import cycle "
                      f"{' -> '.join(cycle + (cycle[0],))}")
    if failed:
        sys.exit(1)
    print("layers: no import cycles, in any folder")


if __name__ == "__main__":
    main()
