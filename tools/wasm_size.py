"""What makes up a `.wasm`: the bytes of each function's code, by crate, and of the data.

Reads a module built with its function names (`CARGO_PROFILE_RELEASE_STRIP=none`: the
shipped build strips them, which changes no code), walks its sections (the code section's
function bodies, the `name` section's function names, which wasm-ld writes demangled) and
prints a markdown table: per crate (the first path segment of a function's name, or of
the type in `<T as Trait>::f`), its functions and code bytes, then the data, the other
sections, and the largest functions. docs/architecture.md reports what it said.

    python tools/wasm_size.py MODULE.wasm [--top N]
"""

import argparse
import re
from collections import Counter
from pathlib import Path

CODE, DATA, CUSTOM = 10, 11, 0
SECTION_NAMES = {1: "type", 2: "import", 3: "function", 4: "table", 5: "memory", 6: "global",
                 7: "export", 8: "start", 9: "element", 10: "code", 11: "data", 12: "data count"}


def leb(data, at):
    """An unsigned LEB128 at `at`: (value, position after it)."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def sections(data):
    """(id, name of a custom section or None, payload) of each section."""
    assert data[:4] == b"\0asm", "not a wasm module"
    at = 8
    while at < len(data):
        kind, at = leb(data, at)
        size, at = leb(data, at)
        payload, at = data[at:at + size], at + size
        name = None
        if kind == CUSTOM:
            length, start = leb(payload, 0)
            name = payload[start:start + length].decode()
        yield kind, name, payload


def imported_functions(payload):
    """How many functions the import section brings in (they come first in the index)."""
    count, at = leb(payload, 0)
    functions = 0
    for _ in range(count):
        for _ in range(2):  # module, field
            length, at = leb(payload, at)
            at += length
        kind = payload[at]
        at += 1
        if kind == 0:  # function: a type index
            _, at = leb(payload, at)
            functions += 1
        elif kind == 1:  # table: element type, limits
            at += 1
            flags, at = leb(payload, at)
            _, at = leb(payload, at)
            if flags & 1:
                _, at = leb(payload, at)
        elif kind == 2:  # memory: limits
            flags, at = leb(payload, at)
            _, at = leb(payload, at)
            if flags & 1:
                _, at = leb(payload, at)
        elif kind == 3:  # global: value type, mutability
            at += 2
    return functions


def body_sizes(payload):
    count, at = leb(payload, 0)
    sizes = []
    for _ in range(count):
        size, at = leb(payload, at)
        sizes.append(size)
        at += size
    return sizes


def function_names(payload):
    """Function index -> name, from the `name` section's function names subsection."""
    length, at = leb(payload, 0)
    at += length
    names = {}
    while at < len(payload):
        kind, at = leb(payload, at)
        size, at = leb(payload, at)
        sub, at = payload[at:at + size], at + size
        if kind != 1:
            continue
        count, p = leb(sub, 0)
        for _ in range(count):
            index, p = leb(sub, p)
            length, p = leb(sub, p)
            names[index] = sub[p:p + length].decode(errors="replace")
            p += length
    return names


LEGACY_ESCAPES = {"$LT$": "<", "$GT$": ">", "$RF$": "&", "$BP$": "*", "$C$": ",", "$SP$": "@",
                  "$u20$": " ", "$u27$": "'", "$u5b$": "[", "$u5d$": "]", "$u7b$": "{",
                  "$u7d$": "}", "$u7e$": "~", "..": "::"}
# A v0 symbol's crate root: `C`, an optional disambiguator `s<base62>_`, then `<len><name>`.
V0_CRATE = re.compile(r"C(?:s[0-9A-Za-z]*_)?(\d+)(?=[A-Za-z_])")


def demangle(name):
    """A Rust symbol as its path (legacy `_ZN...E`; v0 `_R...` kept, its crate read by
    `crate_of`); others (C, the ABI's exports) as they are."""
    if not (name.startswith("_ZN") and name.endswith("E")):
        return name
    parts, at, body = [], 3, name[:-1]
    while at < len(body) and body[at].isdigit():
        digits = re.match(r"\d+", body[at:]).group(0)
        at += len(digits)
        parts.append(body[at:at + int(digits)])
        at += int(digits)
    if parts and re.fullmatch(r"h[0-9a-f]{16}", parts[-1]):
        parts.pop()
    path = "::".join(parts)
    for escape, char in LEGACY_ESCAPES.items():
        path = path.replace(escape, char)
    return path.replace("_<", "<")


def crate_of(name):
    """The crate a function belongs to: `a::b::f` -> a, `<a::T as b::Tr>::f` -> a (and
    `<T as b::Tr>::f` or `<PhantomData<T> as b::Tr>::f`, a generic's, -> b)."""
    if name.startswith("_R"):
        m = V0_CRATE.search(name)
        return name[m.end():m.end() + int(m.group(1))] if m else "?"
    if "::" not in name:
        return "(C and the ABI: dlmalloc, wasi-libc, exports)"
    m = re.match(r"<&?(?:mut |dyn )?([^ ]+) as ([^>]+)>", name)
    if m:
        # A generic's stand-in (`T`, `PhantomData<T>`) says nothing: the trait's crate does.
        own = "::" in m.group(1) and not m.group(1).startswith("core::marker::PhantomData")
        name = m.group(1) if own else m.group(2)
    name = name.lstrip("<&*")
    return re.split(r"::|\[|<| ", name, maxsplit=1)[0] or "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("module")
    parser.add_argument("--top", type=int, default=15, help="largest functions to list")
    args = parser.parse_args()
    data = Path(args.module).read_bytes()
    imported, sizes, names, other = 0, [], {}, Counter()
    for kind, name, payload in sections(data):
        if kind == 2:
            imported = imported_functions(payload)
        if kind == CODE:
            sizes = body_sizes(payload)
        elif name == "name":
            names = function_names(payload)
        if kind == CUSTOM:
            other[f"custom `{name}` (stripped when shipped)"] += len(payload)
        elif kind != CODE:
            other[SECTION_NAMES.get(kind, str(kind))] += len(payload)
    functions = [(demangle(names.get(imported + i, f"function {imported + i}")), size)
                 for i, size in enumerate(sizes)]
    code = sum(size for _, size in functions)
    by_crate, counts = Counter(), Counter()
    for name, size in functions:
        by_crate[crate_of(name)] += size
        counts[crate_of(name)] += 1
    print(f"{len(data):,} bytes; code {code:,} bytes in {len(functions):,} functions\n")
    if not names:
        print("(no `name` section: a stripped build; build with CARGO_PROFILE_RELEASE_STRIP=none "
              "to see crates)\n")
    print("| crate | functions | code bytes | share of code |\n|---|---:|---:|---:|")
    for crate, size in by_crate.most_common():
        print(f"| {crate} | {counts[crate]} | {size:,} | {100 * size / code:.1f} % |")
    print("\n| other sections | bytes |\n|---|---:|")
    for name, size in other.most_common():
        print(f"| {name} | {size:,} |")
    print(f"\n| largest functions | bytes |\n|---|---:|")
    for name, size in sorted(functions, key=lambda f: -f[1])[:args.top]:
        print(f"| `{name}` | {size:,} |")


if __name__ == "__main__":
    main()
