"""An xDS server for the rate limit service's configuration, playing the part Envoy Gateway
plays for its managed envoyproxy/ratelimit: `StreamAggregatedResources`, state of the world,
serving `ratelimit.config.ratelimit.v3.RateLimitConfig` resources, over mutual TLS (its
server certificate, a client certificate required), HTTP/2 by the `h2` library.

The messages are written and read here field by field (the testbed has no protobuf
library): `RateLimitConfig` from the YAML shape envoyproxy/ratelimit reads (`domain`,
`descriptors`, `key`, `value`, `rate_limit: {unit, requests_per_unit, ...}`,
`shadow_mode`), `DiscoveryResponse` around them, and each `DiscoveryRequest` the client
sends read back (its version, nonce, node and error), so a test can wait for an ACK or a
NACK."""

import select
import socket
import ssl
import struct
import threading

import h2.config
import h2.connection
import h2.events
import h2.exceptions

PATH = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
# ratelimit.config.ratelimit.v3.RateLimitUnit.
UNITS = {"SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5, "YEAR": 6, "WEEK": 7}


def varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def length_delimited(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def string(number, text):
    """A string field; nothing when empty, as proto3 writes it."""
    return length_delimited(number, text.encode()) if text else b""


def number(number_, value):
    """A varint field (an int, an enum, a bool); nothing when 0."""
    return varint(number_ << 3) + varint(int(value)) if value else b""


def rate_limit_policy(policy):
    unit = UNITS[policy["unit"].upper()] if "unit" in policy else 0
    return (number(1, unit) + number(2, policy.get("requests_per_unit", 0))
            + number(3, policy.get("unlimited", False))
            + string(4, policy.get("name", ""))
            + b"".join(length_delimited(5, string(1, r["name"]))
                       for r in policy.get("replaces", [])))


def descriptor(d):
    out = string(1, d["key"]) + string(2, d.get("value", "") or "")
    if d.get("rate_limit"):
        out += length_delimited(3, rate_limit_policy(d["rate_limit"]))
    out += b"".join(length_delimited(4, descriptor(c)) for c in d.get("descriptors", []))
    return out + number(5, d.get("shadow_mode", False))


def rate_limit_config(config):
    """A `RateLimitConfig` from its YAML shape (`name` defaults to the domain, as Envoy
    Gateway names each by its domain)."""
    return (string(1, config.get("name", config["domain"])) + string(2, config["domain"])
            + b"".join(length_delimited(3, descriptor(d)) for d in config["descriptors"]))


def discovery_response(version, configs, nonce):
    resources = b"".join(
        length_delimited(2, string(1, TYPE_URL) + length_delimited(2, rate_limit_config(c)))
        for c in configs)
    return string(1, version) + resources + string(4, TYPE_URL) + string(5, nonce)


def fields(data):
    """A message's fields: {number: [value, ...]}, varints as ints, the rest as bytes."""
    out, i = {}, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        kind = key & 7
        if kind == 0:
            value, i = _read_varint(data, i)
        elif kind == 2:
            size, i = _read_varint(data, i)
            value, i = data[i:i + size], i + size
        elif kind == 1:
            value, i = data[i:i + 8], i + 8
        elif kind == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {kind}")
        out.setdefault(key >> 3, []).append(value)
    return out


def _read_varint(data, i):
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def discovery_request(data):
    """The parts of a `DiscoveryRequest` a server acts on: version_info, the node's id,
    type_url, response_nonce and error_detail's message (None without one)."""
    f = fields(data)
    text = lambda n, src=f: src.get(n, [b""])[-1].decode()  # noqa: E731
    node = fields(f[2][-1]) if 2 in f else {}
    error = fields(f[6][-1]) if 6 in f else None
    return {"version_info": text(1), "node": text(1, node), "type_url": text(4),
            "response_nonce": text(5), "error": None if error is None else text(2, error)}


class XdsServer:
    """The server on a free port of 127.0.0.1, over TLS with `pki`'s server certificate,
    requiring a client certificate of its CA (`testbed.pki.make_pki`). `serve(configs)` makes
    them the state of the world, sent to every open stream (and each one opened later) as
    version "1", "2", ...; nothing is sent before the first. `requests` is every request
    received, in order."""

    def __init__(self, pki, port):
        self.port = port
        self.requests = []
        self.version = 0
        self.configs = None
        self.streams_opened = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(pki["server_cert"], pki["server_key"])
        self.tls.load_verify_locations(pki["ca"])
        self.tls.verify_mode = ssl.CERT_REQUIRED
        self.tls.set_alpn_protocols(["h2"])
        self.listener = socket.create_server(("127.0.0.1", port))
        self.listener.settimeout(0.1)
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def serve(self, configs):
        """Makes `configs` (YAML shapes) the state of the world; returns its version."""
        with self.lock:
            self.version += 1
            self.configs = list(configs)
            return str(self.version)

    def acked(self, version):
        """Whether a client accepted `version` (a request naming it, and its nonce, with no
        error)."""
        with self.lock:
            return any(r["version_info"] == version and r["response_nonce"] == version
                       and r["error"] is None for r in self.requests)

    def close(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=5)
        self.listener.close()

    def _accept(self):
        while not self.stopping.is_set():
            try:
                raw, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            thread = threading.Thread(target=self._connection, args=(raw,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _connection(self, raw):
        try:
            raw.settimeout(5)
            sock = self.tls.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        streams = {}  # stream id -> [unread bytes, version sent]
        try:
            sock.sendall(conn.data_to_send())
            while not self.stopping.is_set():
                if sock.pending() or select.select([sock], [], [], 0.05)[0]:
                    data = sock.recv(65536)
                    if not data:
                        return
                    for event in conn.receive_data(data):
                        self._event(conn, streams, event)
                with self.lock:
                    version, configs = str(self.version), self.configs
                for stream_id, state in list(streams.items()):
                    if configs is not None and state[1] != version:
                        message = discovery_response(version, configs, version)
                        conn.send_data(stream_id, struct.pack(">BI", 0, len(message)) + message)
                        state[1] = version
                sock.sendall(conn.data_to_send())
        except (ssl.SSLError, OSError, h2.exceptions.ProtocolError):
            return
        finally:
            sock.close()

    def _event(self, conn, streams, event):
        if isinstance(event, h2.events.RequestReceived):
            headers = dict(event.headers)
            if headers.get(b":path", b"").decode() != PATH:
                conn.send_headers(event.stream_id, [(":status", "200"),
                                                    ("content-type", "application/grpc"),
                                                    ("grpc-status", "12")], end_stream=True)
                return
            conn.send_headers(event.stream_id, [(":status", "200"),
                                                ("content-type", "application/grpc")])
            streams[event.stream_id] = [b"", None]
            with self.lock:
                self.streams_opened += 1
        elif isinstance(event, h2.events.DataReceived):
            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            state = streams.get(event.stream_id)
            if state is None:
                return
            state[0] += event.data
            while len(state[0]) >= 5:
                size = struct.unpack(">I", state[0][1:5])[0]
                if len(state[0]) < 5 + size:
                    break
                message, state[0] = state[0][5:5 + size], state[0][5 + size:]
                with self.lock:
                    self.requests.append(discovery_request(message))
        elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
            streams.pop(event.stream_id, None)
