"""docs/migrating.md's example, run as written: Limitador's limits rewritten as the bridge's
YAML, and the `rate_limits` Envoy sends them with, taken from the page itself, through a
real Envoy and the bridge (`testbed/native_ratelimit.py`)."""

import re
from pathlib import Path

import pytest
import yaml

from testbed.native_ratelimit import RlsStack

PAGE = Path(__file__).resolve().parent.parent.parent / "docs" / "migrating.md"


def page_block(starting):
    """The page's ```yaml block whose text starts with `starting`."""
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
    (block,) = [b for b in blocks if b.startswith(starting)]
    return block


@pytest.fixture
def stack():
    limits = page_block("domain: test_namespace")
    rate_limits = yaml.safe_load(page_block("rate_limits:"))["rate_limits"]
    stack = RlsStack(limits, rate_limits, gateways=1, domain="test_namespace").start()
    yield stack
    stack.close()


def test_limitadors_example_as_the_page_rewrites_it(stack):
    def statuses(method, n, user=None):
        headers = {"x-user-id": user} if user else {}
        return [stack.get(0, "/", headers, method=method)[0] for _ in range(n)]

    # POST: 5 a minute per user; another user has their own; no user, no limit.
    assert statuses("POST", 6, "alice") == [200] * 5 + [429]
    assert statuses("POST", 1, "bob") == [200]
    assert statuses("POST", 7) == [200] * 7
    # GET: 10 a minute in all, with or without a user (its user_id entry finds nothing).
    assert statuses("GET", 4, "alice") + statuses("GET", 7) == [200] * 10 + [429]
    assert statuses("GET", 1, "carol") == [429]
