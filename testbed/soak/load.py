"""The steady load, and one request on its own connection. Python threads on keep-alive
connections rather than bench's loadgen, which keeps only a summary: the soak needs each
request's send time, latency and status to place it against the fault windows."""

import http.client
import itertools
import threading
import time
from array import array

from ..stack import request
from .settings import PATH, REQUEST_TIMEOUT_S


def get_status(port, headers):
    """(status, X-RateLimit-Limit) of one request on its own connection; (0, None) when
    no answer came."""
    try:
        status, answer, _ = request(port, PATH, headers, timeout=REQUEST_TIMEOUT_S)
    except (OSError, http.client.HTTPException):
        return 0, None
    return status, answer.get("x-ratelimit-limit")


class Load:
    """Open-loop steady load: `rate` requests/s in all over `workers` threads, each on one
    keep-alive connection to one gateway (alternating); request n is user n % `users`.
    A worker that falls behind (slow answers) skips the missed slots instead of bursting
    to catch up, so the rate stays bounded. Keeps every request's send time (monotonic),
    latency and status (0: no answer)."""

    def __init__(self, ports, rate, users, workers):
        self.ports, self.users = ports, users
        self.interval = workers / rate
        self.counter = itertools.count()
        self.stopping = threading.Event()
        self.records = [(array("d"), array("d"), array("H")) for _ in range(workers)]
        self.threads = [threading.Thread(target=self.worker, args=(i, workers), daemon=True)
                        for i in range(workers)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=REQUEST_TIMEOUT_S + 5)

    def worker(self, i, workers):
        gateway = i % len(self.ports)
        sent, latency, status = self.records[i]
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[gateway], timeout=REQUEST_TIMEOUT_S)
        next_at = time.monotonic() + i * self.interval / workers
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                if now < next_at:
                    self.stopping.wait(next_at - now)
                    continue
                code = 0
                try:
                    conn.request("GET", PATH, headers={"x-user-id": f"user{next(self.counter) % self.users}"})
                    resp = conn.getresponse()
                    resp.read()
                    code = resp.status
                except (OSError, http.client.HTTPException):
                    conn.close()  # the next request connects again
                done = time.monotonic()
                sent.append(now)
                latency.append(done - now)
                status.append(code)
                next_at = max(next_at + self.interval, done)
        finally:
            conn.close()

    def requests(self):
        """[(sent, latency, status, gateway)] of every request, in no particular order."""
        return [(t, d, s, i % len(self.ports))
                for i, (sent, latency, status) in enumerate(self.records)
                for t, d, s in zip(sent, latency, status)]
