"""The bridge as Envoy Gateway's managed rate limit service, run as its users get it: the
Deployment's environment for envoyproxy/ratelimit (`internal/infrastructure/kubernetes/
ratelimit/resource.go` in envoyproxy/gateway), its configuration served over xDS with
mutual TLS (`testbed.xds`, in Envoy Gateway's place), and Envoys configured in the shapes
Envoy Gateway's translator generates for `BackendTrafficPolicy` global rate limits
(`internal/xds/translator/ratelimit.go`, and its testdata).

There is no Envoy Gateway here: each gateway's configuration is a static bootstrap of the
generated shapes (the listener's `envoy.filters.http.ratelimit` filters, one per domain,
each route's `typed_per_filter_config` of `RateLimitPerRoute`, the `ratelimit_cluster` over
TLS), not delivered over xDS. The rate limit service's side is the real path: the
`RateLimitConfig` resources over `StreamAggregatedResources`."""

import json
from pathlib import Path

from .native_ratelimit import HCM_TYPE, cluster, upstream_tls
from .pki import make_pki
from .stack import BRIDGE, ENVOY, Process, Stack, free_port, request, wait_for
from .xds import XdsServer

RATELIMIT = "envoy.filters.http.ratelimit"
RATELIMIT_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
PER_ROUTE_TYPE = ("type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3."
                  "RateLimitPerRoute")
ROUTER = {"name": "envoy.filters.http.router", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
    "suppress_envoy_headers": True}}
# A Gateway `eg` in namespace `default`, its listener `http`: Envoy Gateway names the
# listener, and so the domain of its routes' own (not shared) rules, `default/eg/http`.
LISTENER = "default/eg/http"


def filter_name(domain, listener=LISTENER):
    """The rate limit filter of a domain: the listener's is `envoy.filters.http.ratelimit`,
    a shared policy's `envoy.filters.http.ratelimit/<namespace>/<policy>`."""
    return RATELIMIT if domain == listener else f"{RATELIMIT}/{domain}"


def ratelimit_filter(domain, timeout, fail_closed, listener=LISTENER):
    """The filter Envoy Gateway puts first in the listener's chain for `domain`."""
    config = {"@type": RATELIMIT_TYPE, "domain": domain,
              "rate_limit_service": {"grpc_service": {"envoy_grpc": {
                  "cluster_name": "ratelimit_cluster"}}, "transport_api_version": "V3"},
              "disable_x_envoy_ratelimited_header": True,
              "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
              "timeout": timeout}
    if fail_closed:
        config["failure_mode_deny"] = True
    return {"name": filter_name(domain, listener), "typed_config": config}


def route(name, prefix, rate_limits_by_domain, listener=LISTENER):
    """A route to the backend whose `typed_per_filter_config` gives each domain's filter its
    `rate_limits`, as Envoy Gateway scopes a route's rules to the filter of their domain."""
    return {"name": name, "match": {"prefix": prefix},
            "route": {"cluster": "backend"},
            "typed_per_filter_config": {
                filter_name(domain, listener): {"@type": PER_ROUTE_TYPE, "domain": domain,
                                      "rate_limits": rate_limits}
                for domain, rate_limits in rate_limits_by_domain.items()}}


def response_metadata(header, namespace, key):
    """A filter that copies the backend's response header `header` into the request's
    dynamic metadata `namespace`:`key`, as an AI gateway's filter records a response's token
    usage there for `cost.response.from: Metadata`."""
    return {"name": "envoy.filters.http.header_to_metadata", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3."
                 "Config",
        "response_rules": [{"header": header, "on_header_present": {
            "metadata_namespace": namespace, "key": key, "type": "NUMBER"},
            "remove": False}]}}


def gateway_config(listen_port, admin_port, backend_port, bridge_port, pki, routes,
                   domains, backend_headers=None, filters_after=(), timeout="2s",
                   fail_closed=True, listener=LISTENER):
    """One gateway's bootstrap: the listener named `listener` (a Gateway's, and the domain
    of its routes' own rules) on `listen_port` with a rate limit filter per domain of
    `domains` (sorted, as Envoy Gateway orders them), `filters_after`, and `routes` (made
    by `route` for the same listener); a second listener on `backend_port` is the backend,
    answering 200 with `backend_headers`."""
    filters = [ratelimit_filter(d, timeout, fail_closed, listener) for d in sorted(domains)]
    front = {"name": listener,
             "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
             "filter_chains": [{"filters": [{
                 "name": "envoy.filters.network.http_connection_manager",
                 "typed_config": {
                     "@type": HCM_TYPE, "stat_prefix": "http-10080",
                     "use_remote_address": True, "normalize_path": True,
                     "merge_slashes": True,
                     "route_config": {"name": listener, "virtual_hosts": [
                         {"name": f"{listener}/*", "domains": ["*"], "routes": routes}]},
                     "http_filters": [*filters, *filters_after, ROUTER]}}]}]}
    backend = {"name": "backend",
               "address": {"socket_address": {"address": "127.0.0.1",
                                              "port_value": backend_port}},
               "filter_chains": [{"filters": [{
                   "name": "envoy.filters.network.http_connection_manager",
                   "typed_config": {
                       "@type": HCM_TYPE, "stat_prefix": "backend",
                       "route_config": {"virtual_hosts": [{
                           "name": "backend", "domains": ["*"], "routes": [{
                               "match": {"prefix": "/"},
                               "direct_response": {"status": 200,
                                                   "body": {"inline_string": "ok\n"}},
                               "response_headers_to_add": [
                                   {"header": {"key": k, "value": v}}
                                   for k, v in (backend_headers or {}).items()]}]}]},
                       "http_filters": [ROUTER]}}]}]}
    # The rate limit service's cluster: HTTP/2 over TLS, presenting Envoy's certificate and
    # trusting the CA of the service's (Envoy Gateway's `ratelimit_cluster`).
    ratelimit = cluster("ratelimit_cluster", bridge_port, http2=True)
    ratelimit["transport_socket"] = upstream_tls(pki)
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                     "port_value": admin_port}}},
            "static_resources": {"listeners": [front, backend],
                                 "clusters": [cluster("backend", backend_port), ratelimit]}}


def deployment_env(workdir, pki, xds_port, redis_port, grpc_port, http_port, prometheus_port):
    """The environment Envoy Gateway's rate limit Deployment gives its container (its
    `default` testdata), with what names a place moved here: the files to `pki`'s, the
    xDS server to `localhost:<xds_port>` (the host its certificate names), Redis to the
    test's Valkey, and the ports, which it leaves at their defaults (gRPC 8081, HTTP 8080),
    to free ones on 127.0.0.1. Envoy Gateway mounts one certificate as both the server's
    and the xDS client's; the testbed's CA issues one for each role."""
    return {
        "RUNTIME_ROOT": str(Path(workdir) / "data"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_IGNOREDOTFILES": "true",
        "RUNTIME_WATCH_ROOT": "false",
        "LOG_LEVEL": "info",
        "USE_STATSD": "false",
        "CONFIG_TYPE": "GRPC_XDS_SOTW",
        "CONFIG_GRPC_XDS_SERVER_URL": f"localhost:{xds_port}",
        "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
        "GRPC_SERVER_USE_TLS": "true",
        "GRPC_SERVER_TLS_CERT": pki["server_cert"],
        "GRPC_SERVER_TLS_KEY": pki["server_key"],
        "GRPC_SERVER_TLS_CA_CERT": pki["ca"],
        "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": pki["client_cert"],
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": pki["client_key"],
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": pki["ca"],
        "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"127.0.0.1:{redis_port}",
        "USE_PROMETHEUS": "true",
        "PROMETHEUS_ADDR": f":{prometheus_port}",
        "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
        "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(grpc_port),
        "HOST": "127.0.0.1", "PORT": str(http_port),
    }


class EnvoyGatewayStack(Stack):
    """Valkey; the bridge started as Envoy Gateway's Deployment starts envoyproxy/ratelimit
    (no arguments, `deployment_env`), configured by `self.xds`; and `gateways` Envoys made
    by `gateway_config` from `routes` and `domains` (and its other options), gateway i with
    `per_gateway[i]`'s over them (another `listener`, `routes`, `domains`: another Gateway
    on the same rate limit service). `serve(configs)` gives the bridge its
    `RateLimitConfig`s and returns once it has accepted them."""

    def __init__(self, routes, domains, gateways=1, per_gateway=(), **options):
        super().__init__(plugin={}, gateways=0)
        self.pki = make_pki(self.workdir)
        self.xds = XdsServer(self.pki, free_port())
        self.http_port, self.prometheus_port = free_port(), free_port()
        # Its probes answer on HOST:PORT in plaintext; the gRPC port speaks TLS.
        self.health_port = self.http_port
        self.bridge.argv = [BRIDGE]
        self.bridge.env = deployment_env(self.workdir, self.pki, self.xds.port,
                                         self.redis_port, self.bridge_port, self.http_port,
                                         self.prometheus_port)
        for i in range(gateways):
            port, admin, backend = free_port(), free_port(), free_port()
            path = Path(self.workdir) / f"envoy-{i}.json"
            own = {"routes": routes, "domains": domains, **options,
                   **(per_gateway[i] if i < len(per_gateway) else {})}
            path.write_text(json.dumps(gateway_config(
                port, admin, backend, self.bridge_port, self.pki, **own)))
            self.envoys.append(Process(f"envoy-{i}", [
                ENVOY, "-c", str(path), "--concurrency", "1", "--disable-hot-restart",
                "--log-level", "warn"], self.workdir))
            self.ports.append(port)
            self.admin_ports.append(admin)

    def serve(self, configs, timeout=20):
        version = self.xds.serve(configs)
        wait_for(f"the bridge's ACK of version {version}", lambda: self.xds.acked(version),
                 timeout=timeout, proc=self.bridge.proc, log=self.bridge.log)
        return version

    def counter(self, gateway, name):
        """One of Envoy's counters, 0 if absent."""
        status, _, body = request(self.admin_ports[gateway], f"/stats?filter=^{name}$", timeout=5)
        assert status == 200, body
        return sum(int(line.rsplit(" ", 1)[1]) for line in body.splitlines() if ": " in line)

    def close(self):
        super().close()
        self.xds.close()
