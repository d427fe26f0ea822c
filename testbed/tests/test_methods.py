"""Method tricks: a rule on `GET` holds for every request the upstream serves as a GET, in
real Envoy. `HEAD` runs a GET's handler (RFC 9110 9.3.2), and where the configuration says
the upstream honours a method-override header, a `POST` carrying `GET` in it is a GET."""

from testbed.plugins import plugin, rule

SEARCH = rule("search-per-ip", ["ip"], 2, match={"path_prefix": "/api/search", "methods": ["GET"]})


def test_head_counts_as_the_get_it_is(stack_of):
    stack = stack_of(plugin(SEARCH))
    assert [stack.get(0, "/api/search", method="HEAD")[0] for _ in range(3)] == [200, 200, 429]
    assert stack.get(0, "/api/search")[0] == 429, "one bucket for GET and HEAD"
    # A POST is another method: this rule does not apply to it.
    assert stack.get(0, "/api/search", method="POST")[0] == 200


def test_a_method_override_the_upstream_honours_is_the_method(stack_of):
    stack = stack_of(plugin(SEARCH, method_override=["x-http-method-override", "x-method"]))
    as_get = [("x-http-method-override", "GET")]
    assert [stack.get(0, "/api/search", as_get, method="POST")[0] for _ in range(2)] == [200, 200]
    assert stack.get(0, "/api/search")[0] == 429
    for spelling in [[("x-http-method-override", "get")], [("x-method", " HEAD ")],
                     [("x-http-method-override", "DELETE"), ("x-http-method-override", "GET")]]:
        assert stack.get(0, "/api/search", spelling, method="POST")[0] == 429, spelling
    # An override the configuration does not name is not honoured, and another method
    # named in it is another method.
    assert stack.get(0, "/api/search", [("x-other-override", "GET")], method="POST")[0] == 200
    assert stack.get(0, "/api/search", [("x-method", "PUT")], method="POST")[0] == 200
