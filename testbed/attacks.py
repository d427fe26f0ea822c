"""Attackers of the bridge, as the security reviews ran them, for the end-to-end tests and
the soak: HTTP/2 peers that hold connections and never read what the bridge sends them,
and a metered client that tries every way of paying less than it consumes (`Metering`).

`Unreading` opens connections that grant the bridge no window (SETTINGS_INITIAL_WINDOW_SIZE
= 0), so no answer's body can ever reach them, while acknowledging SETTINGS and PINGs so
that each connection looks alive. Each sends one request: a health check or a check
without the token (unauthenticated peers, review row 1), or, with the gateways' token, a
gRPC stream fed with large messages as fast as the bridge takes them (row 7). With `hold`,
a connection the bridge closes is opened again, so the attack lasts until `stop()`.
HTTP/2 framing and flow control are the `h2` library's.
"""

import http.client
import itertools
import selectors
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from .client import stream
from .stack import Background

GRPC_PATH = "/ratelimit.v1.Bridge/Check"


def grpc_message(exchange_id, lines):
    """One gRPC message of the bridge's protocol: the exchange id, then check lines."""
    body = f"{exchange_id}\n".encode() + b"".join(line.encode() + b"\n" for line in lines)
    return struct.pack(">BI", 0, len(body)) + body


class Peer:
    """One connection and its one request."""

    def __init__(self, port, path, token, message):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.settimeout(2)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        self.stream = self.h2.get_next_available_stream_id()
        grpc = path == GRPC_PATH
        headers = [(":method", "POST" if grpc or path == "/v1/check" else "GET"),
                   (":scheme", "http"), (":authority", "bridge"), (":path", path)]
        if grpc:
            headers += [("content-type", "application/grpc"), ("te", "trailers")]
        if token:
            headers.append(("authorization", f"Bearer {token}"))
        self.message = message if grpc else None
        self.pending = b""
        self.sent_id = 0
        self.h2.send_headers(self.stream, headers, end_stream=not grpc)
        self.flush()

    def flush(self):
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def feed(self):
        """Sends as much of the message stream as the bridge's window allows."""
        if self.message is None:
            return
        while True:
            if not self.pending:
                self.sent_id += 1
                self.pending = self.message(self.sent_id)
            window = min(self.h2.local_flow_control_window(self.stream),
                         self.h2.max_outbound_frame_size)
            if window <= 0:
                break
            chunk, self.pending = self.pending[:window], self.pending[window:]
            self.h2.send_data(self.stream, chunk)
        self.flush()

    def on_readable(self):
        """False once the bridge closed the connection."""
        data = self.sock.recv(65536)
        if not data:
            return False
        events = self.h2.receive_data(data)
        if any(isinstance(e, (h2.events.ConnectionTerminated, h2.events.StreamReset))
               for e in events):
            return False
        self.feed()
        return True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Unreading(Background):
    """`count` connections to the bridge on `port` that never read, each sending one request
    to `path` (with `token`, if given). On the gRPC path, `message(n)` is the n-th message
    (bytes, framed) a stream sends. Counts the connections the bridge closed (`closed`)."""

    def __init__(self, port, count, path="/healthz", token=None, message=None, hold=True):
        self.port, self.count, self.path, self.token = port, count, path, token
        self.message, self.hold = message, hold
        self.closed = 0
        self.refused = 0
        self.open = 0
        super().__init__()

    def connect(self, selector):
        try:
            peer = Peer(self.port, self.path, self.token, self.message)
        except (OSError, h2.exceptions.H2Error):
            self.refused += 1
            return False
        selector.register(peer.sock, selectors.EVENT_READ, peer)
        self.open += 1
        return True

    def run(self):
        selector = selectors.DefaultSelector()
        for _ in range(self.count):
            if self.stopping.is_set():
                break
            self.connect(selector)
        while not self.stopping.is_set():
            for key, _ in selector.select(timeout=0.2):
                peer = key.data
                try:
                    alive = peer.on_readable()
                except (OSError, h2.exceptions.H2Error):
                    alive = False
                if not alive:
                    selector.unregister(peer.sock)
                    peer.close()
                    self.open -= 1
                    self.closed += 1
            while self.hold and self.open < self.count and not self.stopping.is_set():
                if not self.connect(selector):
                    time.sleep(0.05)
                    break
        for key in list(selector.get_map().values()):
            key.data.close()
        selector.close()


def stream_flood_message(n):
    """About 26 KiB, as the review sent: 52 checks of keys near 500 bytes."""
    return grpc_message(n, [f"rl:att-{n}-{i}-{'p' * 470},1000000,1,1,1" for i in range(52)])


class FreshClients(Background):
    """`rate` requests/s through the gateways on `ports`, each as a client never seen before
    (`header`: a new value every time), as the review flooded Redis with keys (row 8).
    Counts the statuses it got."""

    def __init__(self, ports, rate, path, header):
        self.ports, self.interval, self.path, self.header = ports, 1.0 / rate, path, header
        self.statuses = {}
        super().__init__()

    def run(self):
        conns = [None] * len(self.ports)
        next_at = time.monotonic()
        for n in itertools.count():
            if self.stopping.wait(max(0.0, next_at - time.monotonic())):
                break
            g = n % len(self.ports)
            status = 0
            try:
                if conns[g] is None:
                    conns[g] = http.client.HTTPConnection("127.0.0.1", self.ports[g], timeout=10)
                conns[g].request("GET", self.path, headers={self.header: f"fresh-{n}"})
                response = conns[g].getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                conns[g].close()
                conns[g] = None
            self.statuses[status] = self.statuses.get(status, 0) + 1
            next_at = max(next_at + self.interval, time.monotonic() - 1.0)
        for conn in conns:
            if conn is not None:
                conn.close()


class MeteringAbuser(Background):
    """A client of a metered rule (its API key `key`) trying, one round after another on
    the gateways `ports`, every way of paying less than it consumes that the fourth review
    found (issue 38): accepting gzip, a stream that did not ask for its usage, closing
    before the usage event, a body the upstream reads otherwise than the filter (`NaN`,
    a repeated key), and `parallel` requests at once each reserving 1 token. Every
    response costs the upstream `PROMPT` + `COMPLETION` tokens (a parallel one `PARALLEL`
    prompt tokens and 1 completion token). Counts its answers by kind."""

    PROMPT, COMPLETION, PARALLEL = 200, 100, 1000
    KINDS = ("gzip", "silent stream", "early close", "hostile body", "parallel")

    def __init__(self, ports, path, key, parallel=8, every_s=0.25):
        self.ports, self.path, self.key = ports, path, key
        self.parallel, self.every_s = parallel, every_s
        self.statuses = {kind: {} for kind in self.KINDS}
        super().__init__()

    def send(self, kind, n):
        usage = {"x-api-key": self.key, "x-test-prompt-tokens": str(self.PROMPT),
                 "x-test-completion-tokens": str(self.COMPLETION)}
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        port, on_chunk, body = self.ports[n % len(self.ports)], None, chat
        if kind == "gzip":
            usage["accept-encoding"] = "gzip"
        elif kind == "silent stream":
            body = {**chat, "stream": True}
        elif kind == "early close":
            body = {**chat, "stream": True, "stream_options": {"include_usage": True}}
            usage.update({"x-test-chunks": "3", "x-test-chunk-delay-ms": "20"})
            seen = bytearray()

            def on_chunk(_, data):
                seen.extend(data)
                return seen.count(b"data: ") < 3
        elif kind == "hostile body":
            body = b'{"model": "m", "max_tokens": 1, "x": NaN, "max_tokens": %d}' % self.COMPLETION
        else:
            body = {**chat, "max_tokens": 1}
            usage["x-test-prompt-tokens"] = str(self.PARALLEL)
        try:
            return stream(port, self.path, body, usage, timeout=10, on_chunk=on_chunk).status
        except (OSError, http.client.HTTPException):
            return 0

    def count(self, kind, status):
        counts = self.statuses[kind]
        counts[status] = counts.get(status, 0) + 1

    def run(self):
        with ThreadPoolExecutor(self.parallel) as pool:
            for n in itertools.count():
                kind = self.KINDS[n % len(self.KINDS)]
                if kind == "parallel":
                    futures = [pool.submit(self.send, kind, n + i) for i in range(self.parallel)]
                    for f in futures:
                        self.count(kind, f.result())
                else:
                    self.count(kind, self.send(kind, n))
                if self.stopping.wait(self.every_s):
                    break

    def summary(self):
        return "; ".join(f"{kind}: " + ", ".join(f"{s or 'no answer'} x{c}"
                                                for s, c in sorted(counts.items()))
                         for kind, counts in self.statuses.items() if counts)


class Attacks:
    """The review's attacks on a stack at once, for as long as they run: every connection
    slot of the bridge held by unauthenticated peers that never read (row 1; `slots` is
    the bridge's --max-connections), 20 gRPC streams with the gateways' `token` that never
    read their replies (row 7), and fresh clients creating keys (row 8) at `fresh_rate`
    through the gateways on `fresh_path`, keyed on `fresh_header`."""

    def __init__(self, stack, token, slots, fresh_rate, fresh_path, fresh_header):
        bridge = stack.bridge_port
        self.unauthenticated = [Unreading(bridge, slots // 2, path="/healthz"),
                                Unreading(bridge, slots - slots // 2, path="/v1/check")]
        self.streams = Unreading(bridge, 20, path=GRPC_PATH, token=token,
                                 message=stream_flood_message)
        self.fresh = FreshClients(stack.ports, fresh_rate, fresh_path, fresh_header)
        self.parts = [*self.unauthenticated, self.streams, self.fresh]

    def start(self):
        for part in self.parts:
            part.start()
        return self

    def stop(self):
        for part in self.parts:
            part.stop()

    def summary(self):
        held = sum(u.closed + u.open for u in self.unauthenticated)
        fresh = ", ".join(f"{s or 'no answer'}: {n}" for s, n in sorted(self.fresh.statuses.items()))
        return (f"unauthenticated unreading connections opened {held} "
                f"({sum(u.closed for u in self.unauthenticated)} closed by the bridge, "
                f"{sum(u.refused for u in self.unauthenticated)} refused at connect); "
                f"unreading token streams opened {self.streams.closed + self.streams.open} "
                f"({self.streams.closed} cut by the bridge); fresh clients: {fresh or '-'}")
