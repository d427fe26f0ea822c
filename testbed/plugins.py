"""Plugin configurations for the end-to-end tests, written once: `plugin(rule(...), ...)`
builds the JSON a gateway loads, with the identities most tests need."""

IDENTITY = {
    "user": {"header": "x-user-id"},
    "api_key": {"header": "x-api-key"},
    "ip": {"source": "peer"},
    "tier": {"header": "x-tier", "trusted": True},
}


def plugin(*rules, failure_mode="closed", timeout_ms=1000, identity=None, **extra):
    """A plugin configuration of `rules`, talking to the stack's bridge."""
    return {
        "backend": {"cluster": "ratelimit_bridge", "timeout_ms": timeout_ms},
        "failure_mode": failure_mode,
        "identity": IDENTITY if identity is None else identity,
        "rules": list(rules),
        **extra,
    }


def rule(name, key, requests, per="1h", **extra):
    """A rule `name` keyed on the identities `key`: `requests` per `per`."""
    return {"name": name, "key": key, "limit": {"requests": requests, "per": per}, **extra}
