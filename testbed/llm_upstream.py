"""An OpenAI-compatible upstream on loopback, for the tests of metered limits (a rule's cost
read from the upstream's response: an LLM API's tokens). It answers any method on any path
as `POST /v1/chat/completions`, but the paths of Anthropic's Messages, OpenAI's Responses,
Gemini and Bedrock's Converse, which it answers in those APIs' shapes
(testbed/llm_apis.py), and records the usage it served, so a test can hold the tokens a
gateway debited against the tokens the upstream reported.

It reads a request as OpenAI's API does, where what a gateway meters depends on it: the
body with Python's `json` (which takes `NaN` and `-Infinity`, the last of a repeated key, a
byte order mark, UTF-16 and UTF-32) into a pydantic model in its lax mode (`"max_tokens":
"900"`, `900.0` and `9e2` are all 900; `Served.max_tokens`), and a completion never has more
tokens than the `max_tokens` it read. A request `{"stream": true}` gets OpenAI's server-sent
events: content events (`chat.completion.chunk`, `"usage": null`), then, only if the request
asks with `stream_options.include_usage` (the API's default is not to), one with `"choices":
[]` and the usage, then `data: [DONE]`; each event is written and flushed as a chunk of its
own, so Envoy forwards it as a body chunk of its own when it reads it alone
(`x-test-lockstep` makes sure it does). Any other request gets one `chat.completion` JSON
body with its usage, gzip-compressed when the request accepts gzip (as OpenAI's API does).
testbed/llm_answers.py writes the answers. `started` counts the requests whose headers
arrived, answered or not.

The test chooses the answer with request headers:

- `x-test-prompt-tokens`, `x-test-completion-tokens` (10, 20 if absent): the usage
  reported (`total_tokens` is their sum); `x-test-cached-tokens`, `x-test-reasoning-tokens`
  (0): `prompt_tokens_details.cached_tokens`, `completion_tokens_details.reasoning_tokens`.
- `x-test-chunks` (5): a stream's content events. `x-test-chunk-delay-ms` (0): a pause
  before each event but the first.
- `x-test-abort-after: N`: close the connection after N events (a JSON body: after half
  of it; `gigabyte`'s: after N pieces), without the usage event (unless it was among them)
  and without the terminating chunk: an upstream reset, as the gateway sees it.
- `x-test-usage-header`: `1`, `true` or `total` also sends the total as `x-usage-tokens`;
  any other value is sent there as it is.
- `x-test-encoding: gzip`: the body is gzip-compressed whatever the request accepts, a
  stream's events each flushed whole (an upstream that compresses anyway).
- `x-test-hold: NAME`: the stream waits before its usage event (before `[DONE]` if it has
  none) for the test's `release(NAME)` (30 s at most). `x-test-lockstep: NAME`: it waits
  for a `release(NAME)` before each event but the first (and before an abort), so that
  each event leaves alone.
- `x-test-body`: a hostile answer: `huge-number`, `negative`, `string`, `deep`, `garbage`,
  `truncated`, `gigabyte`, `no-usage` (testbed/llm_answers.py says what each is). Any
  other value is answered 400, so that a misspelt kind cannot pass for a good upstream.
  `x-test-bytes`: the size of `gigabyte` (1 GiB) and of `garbage` (4 KiB).

The abort closes with a FIN, not a RST, so that every event written before it reaches the
gateway (a RST may discard what the peer has not read yet) and a test counts them exactly.
Envoy then closes its client's connection only after its `delayed_close_timeout` (1 s), so
a client sees the cut a second after it.
A `Served` record is made before the response's last write (a stream's terminating chunk,
a JSON body's last byte) or before an abort's close, so a client that saw the end of its
response finds its record already there."""

import json
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pydantic

from . import llm_apis
from .llm_answers import KINDS, Tokens, huge_json_answer, json_answer, stream_events
from .stack import free_port

HOLD_TIMEOUT = 30.0
MAX_REQUEST_BODY = 16 << 20


class _StreamOptions(pydantic.BaseModel):
    include_usage: bool | None = None


class ChatRequest(pydantic.BaseModel):
    """What the API reads of a request's JSON, in pydantic's lax mode as OpenAI's Python
    server code does; everything else is let through."""

    model_config = pydantic.ConfigDict(extra="allow")
    max_tokens: int | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None


def read_request(body):
    """The request as the API reads `body` (bytes); an empty one if it is no valid request
    (the API would answer 400; this upstream is lenient and answers a JSON completion)."""
    try:
        return ChatRequest.model_validate(json.loads(body))
    except (ValueError, RecursionError, pydantic.ValidationError):
        return ChatRequest()


def accepts_gzip(accept_encoding):
    """Whether an `Accept-Encoding` value accepts gzip (a q of 0 refuses it)."""
    for part in accept_encoding.split(","):
        name, _, params = part.strip().partition(";")
        q = params.strip().removeprefix("q=")
        if name.strip().lower() in ("gzip", "*") and q not in ("0", "0.0", "0.00", "0.000"):
            return True
    return False


@dataclass(frozen=True)
class Served:
    """One response: the usage the headers chose (`tokens`, its completion at most the
    `max_tokens` read), whether a usage object as chosen was written whole (`usage_sent`:
    never when `body`, the hostile kind, spoils or drops it, nor in a stream that did not
    ask for it; `gigabyte` keeps it), the events of a stream written (`events`, the usage
    event and `[DONE]` included), the request's path and lower-case headers, the
    `max_tokens` the API read of its body, the response's content coding, when its
    request's headers arrived (`at`, monotonic) and when its response ended, written whole
    or cut short (`ended`)."""

    path: str
    headers: dict
    stream: bool
    body: str | None
    tokens: Tokens
    max_tokens: int | None
    encoding: str | None
    events: int
    usage_sent: bool
    at: float = 0.0
    ended: float = 0.0

    @property
    def total(self):
        return self.tokens.total


class _Aborted(Exception):
    """The response stops here: the test asked for it, the client left or the server stops."""


def _number(headers, name, default, top=1 << 40):
    try:
        return max(0, min(int(headers.get(name, default)), top))
    except ValueError:
        return default


class LlmUpstream:
    """The upstream on 127.0.0.1:`port` (a free one by default), served by a thread per
    connection. `start()`/`stop()`, or `with LlmUpstream() as upstream:`."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.started = 0
        self._served = []
        self._changed = threading.Condition()
        self._holds = {}
        self._waiting = {}
        self._connections = set()
        self.stopping = threading.Event()
        self.server = None
        self.thread = None

    def start(self):
        self.server = _Server(("127.0.0.1", self.port), _Handler)
        self.server.upstream = self
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        """Stops accepting, ends every response in progress (held, slow or endless) and
        closes every connection."""
        if self.server is None:
            return
        self.stopping.set()
        self.server.shutdown()
        with self._changed:
            for conn in list(self._connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.server.server_close()
        self.thread.join(timeout=10)
        self.server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *_):
        self.stop()

    @property
    def served(self):
        """Every `Served` record so far, in the order they were made."""
        with self._changed:
            return list(self._served)

    def tokens_served(self):
        """The total tokens of the usage objects written whole."""
        return sum(s.total for s in self.served if s.usage_sent)

    def tokens_consumed(self, prompt=1, completion=1):
        """What every response cost the API, reported or not, weighing prompt and
        completion tokens so: what a metered client owes."""
        return sum(prompt * s.tokens.prompt + completion * s.tokens.completion
                   for s in self.served)

    def wait_served(self, count, timeout=10.0):
        """The records once there are `count` of them (a client that closed early is seen
        by the server only at its next write); fails after `timeout` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._served) >= count, timeout):
                raise AssertionError(f"{len(self._served)} responses served, not {count}")
            return list(self._served)

    def holding(self, name):
        """How many responses wait on `name` now (`x-test-hold`, `x-test-lockstep`)."""
        with self._changed:
            return self._waiting.get(name, 0)

    def release(self, name, count=1):
        """Lets `count` waits on `name` (`x-test-hold`, `x-test-lockstep`) end, now or when
        they come."""
        self._hold(name).release(count)

    def _hold(self, name):
        with self._changed:
            return self._holds.setdefault(name, threading.Semaphore(0))

    def _wait(self, name):
        """One wait on `name`: until a release, the server stops or HOLD_TIMEOUT passes."""
        hold, deadline = self._hold(name), time.monotonic() + HOLD_TIMEOUT
        with self._changed:
            self._waiting[name] = self._waiting.get(name, 0) + 1
        try:
            while not hold.acquire(timeout=0.05):
                if self.stopping.is_set():
                    raise _Aborted
                if time.monotonic() > deadline:
                    return
        finally:
            with self._changed:
                self._waiting[name] -= 1

    def _record(self, served):
        with self._changed:
            self._served.append(served)
            self._changed.notify_all()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # hundreds of clients connecting at once, not 5


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each event leaves when written

    def log_message(self, *_):
        pass

    def setup(self):
        super().setup()
        with self.server.upstream._changed:
            self.server.upstream._connections.add(self.connection)

    def finish(self):
        with self.server.upstream._changed:
            self.server.upstream._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self):  # noqa: N802 - http.server's names
        self.serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def read_body(self):
        """The request's body; `_Aborted` if the client (a gateway resetting the request
        it refused) left before its end."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            parts, size = [], 0
            while (line := self.rfile.readline(100)) and \
                    (n := int(line.split(b";")[0], 16)) > 0:
                size += n
                if size > MAX_REQUEST_BODY:
                    raise ValueError("request body too large")
                parts.append(self.rfile.read(n))
                self.rfile.readline(10)
            if not line or sum(map(len, parts)) < size:
                raise _Aborted
            while self.rfile.readline(1000) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        length = int(self.headers.get("content-length") or 0)
        if not 0 <= length <= MAX_REQUEST_BODY:
            raise ValueError("request body too large")
        body = self.rfile.read(length)
        if len(body) < length:
            raise _Aborted
        return body

    def serve(self):
        upstream, at = self.server.upstream, time.monotonic()
        with upstream._changed:
            upstream.started += 1
        try:
            body = self.read_body()
        except ValueError as e:
            return self.refuse(400, f"unreadable request body: {e}")
        except (_Aborted, OSError):
            self.close_connection = True
            return
        request = read_request(body)
        api = llm_apis.api_of(self.path)
        streamed = llm_apis.streams(api, self.path, request.stream is True) if api \
            else request.stream is True
        h = {k.lower(): v for k, v in self.headers.items()}
        kind = h.get("x-test-body")
        if kind is not None and kind not in KINDS:
            return self.refuse(400, f"x-test-body {kind!r} is none of {sorted(KINDS)}")
        if api and (kind is not None or "x-test-encoding" in h):
            return self.refuse(400, "x-test-body and x-test-encoding are Chat Completions'")
        completion = _number(h, "x-test-completion-tokens", 20)
        if request.max_tokens is not None:
            completion = max(0, min(completion, request.max_tokens))
        tokens = Tokens(_number(h, "x-test-prompt-tokens", 10), completion,
                        _number(h, "x-test-cached-tokens", 0),
                        _number(h, "x-test-reasoning-tokens", 0))
        forced = h.get("x-test-encoding")
        if forced not in (None, "gzip"):
            return self.refuse(400, f"x-test-encoding {forced!r} is not gzip")
        gzipped = forced == "gzip" or \
            (not streamed and accepts_gzip(h.get("accept-encoding", "")))
        self.plan = {"path": self.path, "headers": h, "stream": streamed, "body": kind,
                     "tokens": tokens, "max_tokens": request.max_tokens,
                     "encoding": "gzip" if gzipped else None, "at": at}
        self.events = 0
        self.usage_sent = self.recorded = False
        self.abort_after = _number(h, "x-test-abort-after", 0) \
            if "x-test-abort-after" in h else None
        self.delay = _number(h, "x-test-chunk-delay-ms", 0, 60_000) / 1000
        # gzip's framing (wbits 31); each event flushed whole (Z_SYNC_FLUSH).
        self.compressor = zlib.compressobj(wbits=31) if gzipped else None
        size = _number(h, "x-test-bytes", (1 << 30) if kind == "gigabyte" else 4096)
        headers = {"content-type": llm_apis.content_type(api, streamed)}
        if gzipped:
            headers["content-encoding"] = "gzip"
        flag = h.get("x-test-usage-header")
        if flag is not None:
            headers["x-usage-tokens"] = str(tokens.total) \
                if flag.lower() in ("1", "true", "total") else flag
        try:
            chunks = _number(h, "x-test-chunks", 5, 100_000)
            if streamed and api:
                events = llm_apis.events(api, tokens, chunks)
                self.send_stream(headers, events, h.get("x-test-hold"), h.get("x-test-lockstep"))
            elif streamed:
                usage = bool(request.stream_options and request.stream_options.include_usage)
                events = ((b"data: " + data + b"\n\n", what)
                          for data, what in stream_events(kind, tokens, chunks, size, usage))
                self.send_stream(headers, events, h.get("x-test-hold"), h.get("x-test-lockstep"))
            elif api:
                self.send_json(headers, self.encoded(llm_apis.body(api, tokens), True))
            elif kind == "gigabyte":
                self.send_pieces(headers, huge_json_answer(tokens, size))
            else:
                self.send_json(headers, self.encoded(json_answer(kind, tokens, size), True))
        except (_Aborted, OSError):
            self.record()
            self.close_connection = True

    def encoded(self, data, last=False):
        """`data` in the response's coding: as it is, or gzip's next bytes (all of them, and
        gzip's end with `last`)."""
        if self.compressor is None:
            return data
        return self.compressor.compress(data) + \
            self.compressor.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)

    def refuse(self, status, message):
        data = json.dumps({"error": {"message": message}}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def record(self):
        if not self.recorded:
            self.recorded = True
            self.server.upstream._record(Served(**self.plan, events=self.events,
                                                usage_sent=self.usage_sent,
                                                ended=time.monotonic()))

    def head(self, headers, length=None):
        self.send_response(200)
        for name, value in headers.items():
            self.send_header(name, value)
        if length is None:
            self.send_header("transfer-encoding", "chunked")
            self.send_header("cache-control", "no-cache")
        else:
            self.send_header("content-length", str(length))
        self.end_headers()

    def send_json(self, headers, data):
        self.head(headers, len(data))
        if self.abort_after is not None:
            self.wfile.write(data[:len(data) // 2])
            raise _Aborted
        # All but the last byte, the record, the last byte: the client has the whole body
        # only once the record is made.
        self.wfile.write(data[:-1])
        self.usage_sent = self.plan["body"] is None
        self.record()
        self.wfile.write(data[-1:])

    def send_pieces(self, headers, pieces):
        self.head(headers)
        for n, piece in enumerate(pieces):
            if self.abort_after is not None and n >= self.abort_after:
                raise _Aborted
            self.chunk(self.encoded(piece))
        if self.compressor is not None:
            self.chunk(self.encoded(b"", True))
        self.usage_sent = True
        self.record()
        self.wfile.write(b"0\r\n\r\n")

    def chunk(self, data):
        if self.server.upstream.stopping.is_set():
            raise _Aborted
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def send_stream(self, headers, events, hold, lockstep):
        """`events`: (each event whole, as bytes ending in its blank line; what it is)."""
        self.head(headers)
        upstream = self.server.upstream
        held = hold is None
        for data, what in events:
            if self.events and lockstep is not None:
                upstream._wait(lockstep)
            if self.abort_after is not None and self.events >= self.abort_after:
                raise _Aborted
            if self.events and self.delay and upstream.stopping.wait(self.delay):
                raise _Aborted
            if what != "content" and not held:
                held = True
                upstream._wait(hold)
            self.chunk(self.encoded(data, what == "done"))
            self.events += 1
            if what == "usage":
                self.usage_sent = self.plan["body"] in (None, "gigabyte")
        if self.abort_after is not None and self.events >= self.abort_after:
            if lockstep is not None:
                upstream._wait(lockstep)
            raise _Aborted
        self.record()
        self.wfile.write(b"0\r\n\r\n")
