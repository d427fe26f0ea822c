"""Path tricks: a rule on a path holds for every spelling of that path, because the filter
matches on the normalized path whatever the host does. Envoy's own normalization
(`normalize_path`, `merge_slashes`, on in envoy.yaml) is off here: the filter sees `:path`
exactly as the client wrote it."""

import json
from pathlib import Path

import pytest

from testbed.plugins import plugin, rule

# Ways to write /api/search that an upstream serves as /api/search (the list the
# normalization's unit tests read too).
SPELLINGS = json.loads((Path(__file__).parent.parent / "data" / "path_spellings.json").read_text())
assert SPELLINGS["path"] == "/api/search"
VARIANTS = SPELLINGS["spellings"]


@pytest.mark.parametrize("condition", ["path", "path_prefix"])
def test_every_spelling_of_a_limited_path_gets_429(stack_of, condition):
    limited = rule("search-per-ip", ["ip"], 1, match={condition: "/api/search"})
    stack = stack_of(plugin(limited), raw_paths=True)
    assert [stack.get(0, "/api/search")[0] for _ in range(2)] == [200, 429]
    admitted = [path for path in VARIANTS if stack.get(0, path)[0] != 429]
    assert admitted == []
    # Only this rule's path is limited: the client itself is not blocked.
    assert stack.get(0, "/api/profile")[0] == 200
