"""The testbed's HTTP/1.1 client, on `http.client`: `request` for a whole answer, `stream`
for one read as it arrives (an upstream's server-sent events through a gateway).

Both send through `_send`, so a streamed request is sent exactly as any other. `stream`
reads the body chunk by chunk of the HTTP/1.1 chunked coding, so a test sees how the
gateway cut the body and whether it ended with the terminating chunk or was cut short (an
upstream reset shows as a body without it)."""

import http.client
import json
from dataclasses import dataclass


def _send(port, path, headers, method, source, timeout, body):
    conn = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=timeout,
        source_address=(source, 0) if source else None)
    try:
        pairs = list(headers.items() if isinstance(headers, dict) else headers or [])
        names = {name.lower() for name, _ in pairs}
        conn.putrequest(method, path, skip_host="host" in names,
                        skip_accept_encoding="accept-encoding" in names)
        if method in ("POST", "PUT", "PATCH") and "content-length" not in names:
            pairs.append(("content-length", str(len(body))))  # as http.client's request() sends
        for name, value in pairs:
            conn.putheader(name, value)
        conn.endheaders(body or None)
        return conn, conn.getresponse()
    except BaseException:
        conn.close()
        raise


def request(port, path="/", headers=None, method="GET", source=None, timeout=10.0, body=b""):
    """One HTTP/1.1 request on its own connection; `source` binds the client address
    (any 127.x.y.z works on loopback). `headers` is a dict, or a list of (name, value)
    pairs to send a header more than once; `body` (bytes) goes with a POST, PUT or PATCH.
    Returns (status, lower-case headers, body)."""
    conn, resp = _send(port, path, headers, method, source, timeout, body)
    try:
        body = resp.read().decode(errors="replace")
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


@dataclass
class Streamed:
    """A response read as it arrived. `chunks`: the HTTP/1.1 chunks of a chunked body that
    arrived whole (the reads of any other body); `size`: the bytes that arrived, of which
    `body` keeps the first `keep`; `complete`: the body ended as its framing says (the
    terminating chunk, or all of its Content-Length); `stopped`: `on_chunk` ended the read
    early; `error`: what cut it short, if anything did."""

    status: int
    headers: dict
    body: bytes
    chunks: int
    size: int
    complete: bool
    stopped: bool = False
    error: str | None = None

    def events(self):
        """The `data:` payloads of a server-sent event stream, in order."""
        return [line[len(b"data: "):] for line in self.body.split(b"\n")
                if line.startswith(b"data: ")]


def stream(port, path="/v1/chat/completions", body=None, headers=None, method="POST",
           source=None, timeout=30.0, on_chunk=None, keep=16 << 20):
    """One request (`body` a dict or list is sent as JSON, bytes as they are), its response
    body read chunk by chunk: `on_chunk(index, data)` is called as each chunk arrives (the
    data of that chunk only) and may return False to close the connection there. Returns a
    `Streamed`; a connection cut mid-body is a result (`complete` False), not an error."""
    pairs = list(headers.items() if isinstance(headers, dict) else headers or [])
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        if "content-type" not in {name.lower() for name, _ in pairs}:
            pairs.append(("content-type", "application/json"))
    conn, resp = _send(port, path, pairs, method, source, timeout, body or b"")
    kept, chunks, current = bytearray(), 0, []
    complete = stopped = False
    error = None
    size = 0

    def arrived(data):
        nonlocal size
        size += len(data)
        kept.extend(data[:max(0, keep - len(kept))])

    try:
        while True:
            data = resp.read1(1 << 16)
            if not data:
                # The end of a chunked body is a read that found the terminating chunk;
                # any other ends complete only if its Content-Length was met.
                complete = resp.chunked or resp.length in (0, None)
                error = None if complete else "the connection closed before the body's end"
                break
            arrived(data)
            current.append(data)
            # read1 stops at a chunk's end (it never reads into the next chunk), and
            # chunk_left is 0 exactly when the current chunk is read whole.
            if resp.chunked and resp.chunk_left:
                continue
            chunk, current = b"".join(current), []
            chunks += 1
            if on_chunk is not None and on_chunk(chunks - 1, chunk) is False:
                stopped = True
                break
    except (http.client.HTTPException, OSError) as e:
        error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return Streamed(resp.status, {k.lower(): v for k, v in resp.getheaders()}, bytes(kept),
                    chunks, size, complete, stopped, error)
