"""Path tricks: a rule on a path holds for every spelling of that path, because the filter
matches on the normalized path whatever the host does. Envoy's own normalization
(`normalize_path`, `merge_slashes`, on in envoy.yaml) is off here: the filter sees `:path`
exactly as the client wrote it."""

import pytest

from testbed.plugins import plugin, rule

# Ways to write /api/search that an upstream resolving dot segments, merging slashes and
# decoding escapes serves as /api/search: each alone, then combined.
VARIANTS = [
    "/api//search",
    "/api/%73earch",
    "/api/%73%65%61%72%63%68",
    "/api/./search",
    "/api/x/../search",
    "/api/%2e/search",
    "/api/x/%2E%2e/search",
    "/api/search?x=1",
    "//api/search",
    "/../api/search",
    "/api/.//%73earch",
    "//api/x//..//./%73earch?q=/api/other",
]


@pytest.mark.parametrize("condition", ["path", "path_prefix"])
def test_every_spelling_of_a_limited_path_gets_429(stack_of, condition):
    limited = rule("search-per-ip", ["ip"], 1, match={condition: "/api/search"})
    stack = stack_of(plugin(limited), raw_paths=True)
    assert [stack.get(0, "/api/search")[0] for _ in range(2)] == [200, 429]
    admitted = [path for path in VARIANTS if stack.get(0, path)[0] != 429]
    assert admitted == []
    # Only this rule's path is limited: the client itself is not blocked.
    assert stack.get(0, "/api/profile")[0] == 200
