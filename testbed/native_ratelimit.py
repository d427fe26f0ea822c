"""Envoy's own `ratelimit` filter pointed at the bridge's Rate Limit Service: the way Envoy
Gateway, Istio and Contour users run it, with no wasm. A stack of Valkey, the bridge
serving `--rls-config` (envoyproxy/ratelimit's YAML) and N Envoys whose routes carry the
`rate_limits` actions that make descriptors.

Each Envoy answers its requests from a second listener of its own (`/` answers 200, with
the response headers the test asks for), because Envoy applies route rate limits only to
routes that go to a cluster, never to a `direct_response`.
"""

import json
from pathlib import Path

from .pki import make_pki
from .stack import ENVOY, Process, Stack, free_port, request

RATELIMIT_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
HCM_TYPE = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager."
            "v3.HttpConnectionManager")
HTTP2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
    "explicit_http_config": {"http2_protocol_options": {}}}}


def cluster(name, port, http2=False):
    entry = {"name": name, "type": "STATIC", "connect_timeout": "1s",
             "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                 {"endpoint": {"address": {"socket_address": {
                     "address": "127.0.0.1", "port_value": port}}}}]}]}}
    if http2:
        entry["typed_extension_protocol_options"] = HTTP2
    return entry


def listener(name, port, routes, http_filters):
    return {"name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": HCM_TYPE, "stat_prefix": name,
                    "route_config": {"virtual_hosts": [
                        {"name": name, "domains": ["*"], "routes": routes}]},
                    "http_filters": [*http_filters, {
                        "name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http."
                                     "router.v3.Router"}}]}}]}]}


def upstream_tls(pki):
    """A cluster's transport socket to the bridge over TLS, trusting `pki`'s CA (made by
    `testbed.pki.make_pki`) and presenting its client certificate."""
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                 "UpstreamTlsContext",
        "sni": "localhost",
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "tls_certificates": [{"certificate_chain": {"filename": pki["client_cert"]},
                                  "private_key": {"filename": pki["client_key"]}}],
            "validation_context": {"trusted_ca": {"filename": pki["ca"]},
                                   "match_typed_subject_alt_names": [{
                                       "san_type": "DNS",
                                       "matcher": {"exact": "localhost"}}]}}}}


def native_config(listen_port, admin_port, origin_port, bridge_port, rate_limits,
                  domain="api", failure_mode_deny=False, token=None, origin_headers=None,
                  ratelimit_options=None, pki=None, upstream=None):
    """An Envoy bootstrap: `listen_port` serves every path through the `ratelimit` filter
    (domain `domain`) with `rate_limits` on its route, to the origin on `origin_port`,
    which answers 200 with `origin_headers` (or, with `upstream`, to a server of the test's
    on that port: testbed/llm_upstream.py's, say); with `pki`, it reaches the bridge over
    mutual TLS (`upstream_tls`)."""
    service = {"envoy_grpc": {"cluster_name": "ratelimit_bridge"}, "timeout": "2s"}
    if token is not None:
        service["initial_metadata"] = [{"key": "authorization", "value": f"Bearer {token}"}]
    ratelimit = {"@type": RATELIMIT_TYPE, "domain": domain, "timeout": "2s",
                 "failure_mode_deny": failure_mode_deny,
                 "rate_limit_service": {"transport_api_version": "V3",
                                        "grpc_service": service},
                 **(ratelimit_options or {})}
    front = listener("front", listen_port, [{
        "match": {"prefix": "/"},
        "route": {"cluster": "origin", "rate_limits": rate_limits}}],
        [{"name": "envoy.filters.http.ratelimit", "typed_config": ratelimit}])
    origin = listener("origin", origin_port, [{
        "match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}},
        "response_headers_to_add": [
            {"header": {"key": k, "value": v}} for k, v in (origin_headers or {}).items()]}],
        [])
    bridge = cluster("ratelimit_bridge", bridge_port, http2=True)
    if pki is not None:
        bridge["transport_socket"] = upstream_tls(pki)
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                     "port_value": admin_port}}},
            "static_resources": {
                "listeners": [front] if upstream else [front, origin],
                "clusters": [cluster("origin", upstream or origin_port), bridge]}}


class RlsStack(Stack):
    """Valkey, the bridge serving `rls_yaml` (text, written to a file it watches), and
    `gateways` Envoys made by `native_config` with the other options, and gateway i with
    `per_gateway[i]`'s over them. With `tls`, the bridge serves mutual TLS (`self.pki`'s
    files) and its health on a plaintext probe port, and the gateways reach it so."""

    def __init__(self, rls_yaml, rate_limits, gateways=2, bridge_args=(), per_gateway=(),
                 tls=False, **options):
        super().__init__(plugin={}, gateways=0, bridge_args=bridge_args)
        self.rls_file = Path(self.workdir) / "rls.yaml"
        self.rls_file.write_text(rls_yaml)
        self.bridge.argv += ["--rls-config", str(self.rls_file)]
        self.pki = make_pki(self.workdir) if tls else None
        if tls:
            self.health_port = free_port()
            self.bridge.argv += [
                "--tls-cert", self.pki["server_cert"], "--tls-key", self.pki["server_key"],
                "--tls-client-ca", self.pki["ca"],
                "--probe-listen", f"127.0.0.1:{self.health_port}"]
            options["pki"] = self.pki
        for i in range(gateways):
            port, admin, origin = free_port(), free_port(), free_port()
            path = Path(self.workdir) / f"envoy-{i}.json"
            own = {**options, **(per_gateway[i] if i < len(per_gateway) else {})}
            path.write_text(json.dumps(native_config(
                port, admin, origin, self.bridge_port, rate_limits, **own)))
            self.envoys.append(Process(f"envoy-{i}", [
                ENVOY, "-c", str(path), "--concurrency", "1", "--disable-hot-restart",
                "--log-level", "warn"], self.workdir))
            self.ports.append(port)
            self.admin_ports.append(admin)

    def counter(self, gateway, name):
        """One of Envoy's counters (`cluster.ratelimit_bridge.ratelimit.ok`, ...), 0 if absent."""
        status, _, body = request(self.admin_ports[gateway], f"/stats?filter=^{name}$", timeout=5)
        assert status == 200, body
        values = [int(line.rsplit(" ", 1)[1]) for line in body.splitlines() if ": " in line]
        return sum(values)

