"""JWT identities behind Envoy's own `jwt_authn` filter (an HS256 provider with an inline
JWKS), end to end: whatever `jwt_authn` lets through, the rules keyed on the token's
claims still apply. A token that is present but unreadable, padded or sent twice never
exempts a request."""

import base64
import hashlib
import hmac
import json
import time

import pytest

from testbed.plugins import plugin, rule
from testbed.stack import Stack

ISSUER = "https://issuer.testbed"
SECRET = b"testbed-hs256-secret-of-32-bytes"


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(sub):
    """A token `jwt_authn` verifies, for subject `sub`."""
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    claims = {"iss": ISSUER, "sub": sub, "exp": int(time.time()) + 3600}
    signed = f"{header}.{b64url(json.dumps(claims).encode())}"
    signature = hmac.new(SECRET, signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{b64url(signature)}"


def jwt_authn():
    """Envoy's `jwt_authn` requiring a token of ISSUER on every path, which it then leaves
    in `authorization` (`forward`) and forwards the payload of in `x-jwt-payload`."""
    jwks = {"keys": [{"kty": "oct", "alg": "HS256", "kid": "k1", "k": b64url(SECRET)}]}
    provider = {"issuer": ISSUER, "local_jwks": {"inline_string": json.dumps(jwks)},
                "forward": True, "forward_payload_header": "x-jwt-payload"}
    return {"name": "envoy.filters.http.jwt_authn", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
        "providers": {"testbed": provider},
        "rules": [{"match": {"prefix": "/"}, "requires": {"provider_name": "testbed"}}]}}


IDENTITY = {
    "bearer": {"jwt": {"header": "authorization", "unverified": True}},
    "verified": {"jwt": {"header": "x-jwt-payload"}},
}


@pytest.fixture(scope="module")
def stack():
    """One gateway: `jwt_authn`, then the filter with a rule of 2 per minute per subject of
    the bearer token itself, and one of 100 on the payload `jwt_authn` verified."""
    config = plugin(rule("per-bearer", ["bearer"], 2, per="1m"),
                    rule("per-verified", ["verified"], 100, per="1m"), identity=IDENTITY)
    stack = Stack(config, gateways=1, filters_before=[jwt_authn()])
    yield stack.start()
    stack.close()


def statuses(stack, authorization, n=4):
    return [stack.get(0, "/api/x", [("authorization", a) for a in authorization])[0]
            for _ in range(n)]


def test_jwt_authn_refuses_what_it_cannot_verify_and_the_rule_limits_the_rest(stack):
    assert statuses(stack, [f"Bearer {token('alice')}"]) == [200, 200, 429, 429]
    assert stack.get(0, "/api/x")[0] == 401
    assert stack.get(0, "/api/x", {"authorization": f"Bearer {token('eve')}x"})[0] == 401


# Ways to write a valid token's header that jwt_authn accepts, each over 8 KiB.
PADDINGS = {
    "spaces": lambda t: "Bearer" + " " * 8200 + t,
    "tabs and spaces": lambda t: "Bearer " + "\t " * 4100 + t + " " * 100,
    "junk before the token": lambda t: "Bearer " + "!" * 8200 + t,
    "text before Bearer": lambda t: "x" * 8200 + " Bearer " + t,
    "a padded signature": lambda t: "Bearer" + " " * 8200 + t + "=",
}


@pytest.mark.parametrize("padding", PADDINGS)
def test_a_padded_token_jwt_authn_accepts_is_still_limited(stack, padding):
    valid = token(f"padded-{padding}")
    padded = PADDINGS[padding](valid)
    assert len(padded) > 8192
    # The first two take the subject's tokens whether padded or not; the rest are refused.
    assert statuses(stack, [padded]) == [200, 200, 429, 429]
    assert statuses(stack, [f"Bearer {valid}"], n=1) == [429], "one bucket, padded or not"


def test_a_forged_payload_header_is_replaced_by_the_verified_one(stack):
    forged = b64url(json.dumps({"sub": "victim"}).encode())
    headers = [("authorization", f"Bearer {token('forger')}"), ("x-jwt-payload", forged)]
    assert stack.get(0, "/api/x", headers)[0] == 200
    keys = stack.redis("KEYS", "rl:per-verified:*")
    assert "rl:per-verified:forger" in keys and "rl:per-verified:victim" not in keys, keys


def test_a_token_sent_twice_is_refused_not_ignored(stack_of):
    # No jwt_authn here (the upstream verifies the token): Envoy joins the two copies into
    # one value, "Bearer a,Bearer b", which must not read as no token.
    stack = stack_of(plugin(rule("per-bearer", ["bearer"], 2, per="1m"),
                            rule("per-verified", ["verified"], 100, per="1m"), identity=IDENTITY))
    for second in [token("victim"), token("mallory"), "garbage"]:
        twice = [f"Bearer {token('mallory')}", f"Bearer {second}"]
        status, _, body = stack.get(0, "/api/x", [("authorization", a) for a in twice])
        assert status == 400, (second, body)
        assert "authorization header appears more than once" in body
    # A forwarded payload sent twice is refused the same way (Envoy keeps its copies apart).
    payload = token("mallory").split(".")[1]
    twice = [("x-jwt-payload", payload), ("x-jwt-payload", payload)]
    assert stack.get(0, "/api/x", twice)[0] == 400
    assert statuses(stack, [f"Bearer {token('mallory')}"], n=3) == [200, 200, 429]
    assert stack.stats().get("rejected") == 4


def test_a_present_but_unreadable_token_is_refused(stack_of):
    stack = stack_of(plugin(rule("per-bearer", ["bearer"], 2, per="1m"), identity=IDENTITY))
    header, payload, signature = token("mallory").split(".")
    for unreadable in [f"Bearer {header}.{payload}", f"Bearer {header}.{payload}.{signature}.x",
                       f"Bearer {header}.!{payload}.{signature}", f"Bearer a.{b64url(b'[1]')}.c",
                       f"Bearer a.{payload[:-1]}.c"]:
        status, _, body = stack.get(0, "/api/x", {"authorization": unreadable})
        assert status == 400, (unreadable, body)
        assert "authorization header holds no readable JWT" in body
    # Another scheme holds no token at all: the rule is not for it (jwt_authn would say
    # "Jwt is missing").
    assert statuses(stack, ["Basic dXNlcjpwYXNz"], n=3) == [200, 200, 200]
