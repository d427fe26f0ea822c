"""What testbed/llm_upstream.py answers, apart from how it sends it: OpenAI's
`chat.completion` body and `chat.completion.chunk` events, with the usage a test chose,
written well or, for the tests of a gateway that reads usage from responses, in one of the
hostile ways an upstream (or whatever answers in its name) might write it.

The hostile kinds (`x-test-body`): `huge-number` (completion and total tokens 10^30, past
any 64-bit integer), `negative` (each count negated), `string` (`"prompt_tokens": "12"`:
each count a string), `deep` (the usage nested in 100,000 arrays, which a recursive parser
cannot descend), `garbage` (seeded random bytes that are no JSON, in place of the body or
of the usage event's data), `truncated` (the JSON cut in the middle of the usage object; a
stream still ends with `[DONE]`), `gigabyte` (`size` bytes of content, made as they are
sent and never held: events of 16 KiB, or one JSON body in pieces; its usage is well
formed), `no-usage` (a valid answer without usage; a stream without its usage event).

The usage goes last in each object, as OpenAI writes it, so that a reader must take the
whole body (or event) before it knows the cost."""

import json
import random
import time
from typing import NamedTuple

KINDS = frozenset({"huge-number", "negative", "string", "deep", "garbage", "truncated",
                   "gigabyte", "no-usage"})
HUGE = 10**30
DEPTH = 100_000
PIECE = 16 << 10  # a `gigabyte` event's content, and a piece of its JSON body
MODEL = "test-model"


class Tokens(NamedTuple):
    prompt: int
    completion: int
    cached: int = 0
    reasoning: int = 0

    @property
    def total(self):
        return self.prompt + self.completion


def usage(t):
    """OpenAI's usage object for `t` (a `Tokens`)."""
    return {"prompt_tokens": t.prompt, "completion_tokens": t.completion,
            "total_tokens": t.total,
            "prompt_tokens_details": {"cached_tokens": t.cached},
            "completion_tokens_details": {"reasoning_tokens": t.reasoning}}


def usage_text(kind, t):
    """The usage object as JSON text, as `kind` (None: well) writes it."""
    if kind == "huge-number":
        return json.dumps({**usage(t._replace(completion=HUGE)), "total_tokens": t.prompt + HUGE})
    if kind == "negative":
        return json.dumps(usage(Tokens(-max(t.prompt, 1), -max(t.completion, 1), -t.cached,
                                       -t.reasoning)))
    if kind == "string":
        return json.dumps({k: str(v) if isinstance(v, int) else {n: str(x) for n, x in v.items()}
                           for k, v in usage(t).items()})
    text = json.dumps(usage(t))
    return "[" * DEPTH + text + "]" * DEPTH if kind == "deep" else text


def with_usage(obj, text, kind=None):
    """`obj` as JSON with `"usage": text` last, cut in the middle of it if `truncated`."""
    whole = json.dumps(obj)[:-1] + ', "usage": ' + text + "}"
    if kind == "truncated":
        return whole[:len(whole) - 1 - len(text) // 2]
    return whole


def garbage(size, seed=0):
    """Bytes that are no JSON (nor UTF-8: they start with 0xff), the same for the same seed."""
    return b"\xff" + random.Random(seed).randbytes(max(size - 1, 0))


def json_answer(kind, t, size):
    """The `chat.completion` body (not `gigabyte`'s: `huge_json_answer`)."""
    if kind == "garbage":
        return garbage(size)
    obj = {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
           "model": MODEL, "choices": [{"index": 0, "finish_reason": "stop", "message": {
               "role": "assistant", "content": "tok0 tok1 tok2 "}}]}
    if kind == "no-usage":
        return json.dumps(obj).encode()
    return with_usage(obj, usage_text(kind, t), kind).encode()


def huge_json_answer(t, size):
    """`gigabyte`'s `chat.completion` body in pieces: `size` bytes of content, then usage."""
    yield (b'{"id": "chatcmpl-test", "object": "chat.completion", "model": "' + MODEL.encode()
           + b'", "choices": [{"index": 0, "message": {"role": "assistant", "content": "')
    piece = b"x" * PIECE
    for _ in range(size // PIECE):
        yield piece
    yield b'"}, "finish_reason": "stop"}], "usage": ' + json.dumps(usage(t)).encode() + b"}"


def stream_events(kind, t, chunks, size, usage=True):
    """(data, what) of each event of a stream, in order; what is "content", "usage" (the
    event with `"choices": []`, only if `usage`: the request asked for it) or "done"
    (`[DONE]`)."""
    base = {"id": "chatcmpl-test", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": MODEL}
    if kind == "gigabyte":
        choice = {"index": 0, "delta": {"content": "x" * PIECE}, "finish_reason": None}
        event = json.dumps({**base, "choices": [choice], "usage": None}).encode()
        for _ in range(max(1, -(-size // len(event)))):  # at least `size` bytes
            yield event, "content"
    else:
        for i in range(chunks):
            delta = {"content": f"tok{i} "} if i else {"role": "assistant", "content": "tok0 "}
            choice = {"index": 0, "delta": delta,
                      "finish_reason": "stop" if i == chunks - 1 else None}
            yield json.dumps({**base, "choices": [choice], "usage": None}).encode(), "content"
    if usage and kind == "garbage":
        yield garbage(size), "usage"
    elif usage and kind != "no-usage":
        text = usage_text(None if kind == "gigabyte" else kind, t)
        yield with_usage({**base, "choices": []}, text, kind).encode(), "usage"
    yield b"[DONE]", "done"
