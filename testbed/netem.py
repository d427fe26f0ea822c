"""A TCP proxy that makes loopback behave like the network between two regions, for the
tests of global rules (these machines have no `tc netem` and no toxiproxy): added latency
(each byte delivered half the round trip later, each way, in order, without holding up the
bytes behind it), a full partition (nothing passes either way; connections hang as over a
cut link, new ones are accepted and starved), replies lost one way (what the client
sends arrives, nothing comes back), and connections gone silent (`silence()`: those open
pass nothing more, new ones pass). As over TCP, bytes are held, never lost: when a fault
ends, what it held goes on, in order (a connection that gave up meanwhile is the client's
to close), so the protocol on top never sees a reply without its request. `reset()` aborts
every connection, as a timeout or a reset would. Faults change while connections are open:
`set(...)` takes effect for the next byte.

One asyncio loop in a thread of its own serves every connection. `FaultProxy(target_port)`
listens on a free port (`port`); `start()`/`stop()`, or `with FaultProxy(...) as proxy:`."""

import asyncio
import threading
import time
from dataclasses import dataclass

from .stack import free_port

CHUNK = 1 << 16


@dataclass
class Faults:
    """The link now: `rtt_ms` added to every round trip; `cut`: nothing passes (held);
    `drop_replies`: nothing passes from the target back to the client (held)."""
    rtt_ms: float = 0.0
    cut: bool = False
    drop_replies: bool = False


class FaultProxy:
    def __init__(self, target_port, port=None, host="127.0.0.1"):
        self.target = (host, target_port)
        self.port = port or free_port()
        self.faults = Faults()
        self.loop = None
        self.thread = None
        self.server = None
        self.writers = set()
        # Connections are numbered as they come; those below `silent_below` pass nothing.
        self.serial = 0
        self.silent_below = 0
        self.ready = threading.Event()
        # Bytes each way that were delivered, for the tests' own checks.
        self.forwarded = {"up": 0, "down": 0}

    def retarget(self, port):
        """New connections go to `port` from now (a failover moved the server)."""
        self.target = (self.target[0], port)

    def reset(self):
        """Aborts every open connection."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._abort_all)

    def _abort_all(self):
        for writer in list(self.writers):
            writer.transport.abort()

    def silence(self):
        """Every connection open now passes nothing more, either way, and is never closed:
        a NAT or load balancer on the way forgot it. New connections pass."""
        self.silent_below = self.serial
        return self

    def blocked(self, way, serial):
        f = self.faults
        return serial < self.silent_below or f.cut or (way == "down" and f.drop_replies)

    def set(self, rtt_ms=None, cut=None, drop_replies=None):
        """Changes the faults (None: as they are)."""
        f = self.faults
        self.faults = Faults(f.rtt_ms if rtt_ms is None else rtt_ms,
                             f.cut if cut is None else cut,
                             f.drop_replies if drop_replies is None else drop_replies)
        return self

    def start(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError(f"fault proxy on :{self.port} did not start")
        return self

    def stop(self):
        if self.loop is None:
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *_):
        self.stop()

    def _run(self):
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, backlog=1024))
        self.ready.set()
        try:
            self.loop.run_forever()
        finally:
            self.server.close()
            for writer in list(self.writers):
                writer.transport.abort()
            # Every connection's tasks end here, not destroyed pending with the loop.
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    async def _serve(self, client_r, client_w):
        serial, self.serial = self.serial, self.serial + 1
        self.writers.add(client_w)
        try:
            target_r, target_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            self.writers.discard(client_w)
            return
        self.writers.add(target_w)
        # Either side closing (a server that died, a client that gave up) closes both.
        pipes = [asyncio.ensure_future(self._pipe(client_r, target_w, "up", serial)),
                 asyncio.ensure_future(self._pipe(target_r, client_w, "down", serial))]
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        for w in (client_w, target_w):
            w.transport.abort()
            self.writers.discard(w)

    async def _pipe(self, reader, writer, way, serial):
        """Reads `way`'s bytes as they come and delivers each chunk half a round trip
        later, in order, unless the faults drop it."""
        queue = asyncio.Queue()

        async def deliver():
            while True:
                due, data = await queue.get()
                if data is None:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                while self.blocked(way, serial):
                    await asyncio.sleep(0.005)
                writer.write(data)
                self.forwarded[way] += len(data)
                await writer.drain()

        delivering = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(CHUNK):
                queue.put_nowait((time.monotonic() + self.faults.rtt_ms / 2000.0, data))
        finally:
            queue.put_nowait((0, None))
            await asyncio.gather(delivering, return_exceptions=True)
