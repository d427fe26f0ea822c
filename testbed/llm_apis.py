"""What testbed/llm_upstream.py answers on the paths of APIs other than OpenAI's Chat
Completions, in the shapes those APIs send, with the usage a test chose (`Tokens`: the
prompt, the completion, the cached part of the prompt, the reasoning part of the
completion), for the tests of the meter's usage formats (docs/configuration.md#usage-formats):

- `/v1/messages`: Anthropic's Messages. A body's `usage`; a stream (`"stream": true`) of
  `message_start` (`message.usage`: the input, 1 output token), content events, a
  `message_delta` whose `usage` has the output so far and, as newer versions do, the input
  again, then `message_stop`. Its `input_tokens` exclude cache reads
  (`cache_read_input_tokens`); reasoning is output.
- `/v1/responses`: OpenAI's Responses. A body's `usage`; a stream of `response.created`
  (`"usage": null`), text deltas, then `response.completed` with `response.usage`.
- `...:generateContent`, `...:streamGenerateContent` (`?alt=sse`): Gemini. `usageMetadata`
  in the body, and in every chunk of a stream, the candidates' count growing; thoughts are
  counted apart from candidates, the cached part within the prompt.
- `/model/.../converse`, `/model/.../converse-stream`: Bedrock's Converse: a body's
  `usage`, input excluding cache reads; a stream in AWS's binary event stream
  (`application/vnd.amazon.eventstream`, CRCs and all), its usage in the `metadata` event.

Each stream event comes whole (server-sent events: `event:` line and all, ending in a blank
line; AWS's: one message), as bytes, with what it is: "content", "usage" (the event with the
final usage) or "done"."""

import json
import struct
import zlib

MODEL = "test-model"


def api_of(path):
    """The API a request's path is one of, or None (Chat Completions)."""
    route = path.split("?", 1)[0]
    if route.endswith("/v1/messages"):
        return "anthropic"
    if route.endswith("/v1/responses"):
        return "openai-responses"
    if route.endswith(":generateContent") or route.endswith(":streamGenerateContent"):
        return "gemini"
    if route.startswith("/model/") and route.endswith(("/converse", "/converse-stream")):
        return "bedrock-converse"
    return None


def streams(api, path, asked_stream):
    """Whether the request asks for a stream: Gemini's and Converse's by the path, the
    others' by the body's `"stream": true`."""
    route = path.split("?", 1)[0]
    if api == "gemini":
        return route.endswith(":streamGenerateContent")
    if api == "bedrock-converse":
        return route.endswith("/converse-stream")
    return asked_stream


def content_type(api, streamed):
    if not streamed:
        return "application/json"
    return "application/vnd.amazon.eventstream" if api == "bedrock-converse" \
        else "text/event-stream"


def aws_message(event, payload):
    """One message of AWS's event stream: the event's headers (each a name, type 7, a
    string), the payload's JSON, and both CRC-32s."""
    headers = b""
    for name, value in ((":event-type", event), (":content-type", "application/json"),
                        (":message-type", "event")):
        headers += bytes([len(name)]) + name.encode() + b"\x07" \
            + struct.pack(">H", len(value)) + value.encode()
    data = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(headers) + len(data) + 4, len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + headers + data
    return message + struct.pack(">I", zlib.crc32(message))


def _event(name, data):
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + json.dumps(data).encode() + b"\n\n"


def anthropic_usage(t, output):
    return {"input_tokens": t.prompt - t.cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": t.cached, "output_tokens": output}


def responses_usage(t):
    return {"input_tokens": t.prompt, "input_tokens_details": {"cached_tokens": t.cached},
            "output_tokens": t.completion,
            "output_tokens_details": {"reasoning_tokens": t.reasoning},
            "total_tokens": t.total}


def gemini_usage(t, candidates):
    return {"promptTokenCount": t.prompt, "cachedContentTokenCount": t.cached,
            "candidatesTokenCount": candidates, "thoughtsTokenCount": t.reasoning,
            "totalTokenCount": t.prompt + candidates + t.reasoning}


def body(api, t):
    """The non-streamed answer's JSON, as bytes."""
    text = "tok0 tok1 tok2 "
    if api == "anthropic":
        obj = {"id": "msg_test", "type": "message", "role": "assistant", "model": MODEL,
               "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
               "usage": anthropic_usage(t, t.completion)}
    elif api == "openai-responses":
        obj = {"id": "resp_test", "object": "response", "status": "completed", "model": MODEL,
               "output": [{"type": "message", "role": "assistant",
                           "content": [{"type": "output_text", "text": text}]}],
               "usage": responses_usage(t)}
    elif api == "gemini":
        obj = {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                               "finishReason": "STOP"}],
               "usageMetadata": gemini_usage(t, t.completion - t.reasoning),
               "modelVersion": MODEL}
    else:
        obj = {"output": {"message": {"role": "assistant", "content": [{"text": text}]}},
               "stopReason": "end_turn",
               "usage": {"inputTokens": t.prompt - t.cached, "outputTokens": t.completion,
                         "totalTokens": t.total, "cacheReadInputTokens": t.cached,
                         "cacheWriteInputTokens": 0},
               "metrics": {"latencyMs": 1}}
    return json.dumps(obj).encode()


def events(api, t, chunks):
    """The streamed answer's events, in order: (bytes, what)."""
    if api == "anthropic":
        start = {"type": "message_start", "message": {
            "id": "msg_test", "type": "message", "role": "assistant", "model": MODEL,
            "content": [], "stop_reason": None, "usage": anthropic_usage(t, 1)}}
        yield _event("message_start", start), "content"
        yield _event("content_block_start", {"type": "content_block_start", "index": 0,
                                             "content_block": {"type": "text", "text": ""}}), \
            "content"
        for i in range(chunks):
            yield _event("content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": f"tok{i} "}}), "content"
        yield _event("content_block_stop", {"type": "content_block_stop", "index": 0}), \
            "content"
        yield _event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": "end_turn"},
                                       "usage": anthropic_usage(t, t.completion)}), "usage"
        yield _event("message_stop", {"type": "message_stop"}), "done"
    elif api == "openai-responses":
        response = {"id": "resp_test", "object": "response", "model": MODEL, "output": []}
        yield _event("response.created", {"type": "response.created", "response": {
            **response, "status": "in_progress", "usage": None}}), "content"
        for i in range(chunks):
            yield _event("response.output_text.delta", {
                "type": "response.output_text.delta", "output_index": 0,
                "content_index": 0, "delta": f"tok{i} "}), "content"
        yield _event("response.completed", {"type": "response.completed", "response": {
            **response, "status": "completed", "usage": responses_usage(t)}}), "usage"
    elif api == "bedrock-converse":
        yield aws_message("messageStart", {"role": "assistant"}), "content"
        for i in range(chunks):
            yield aws_message("contentBlockDelta", {"contentBlockIndex": 0,
                                                    "delta": {"text": f"tok{i} "}}), "content"
        yield aws_message("contentBlockStop", {"contentBlockIndex": 0}), "content"
        yield aws_message("messageStop", {"stopReason": "end_turn"}), "content"
        yield aws_message("metadata", {
            "usage": {"inputTokens": t.prompt - t.cached, "outputTokens": t.completion,
                      "totalTokens": t.total, "cacheReadInputTokens": t.cached,
                      "cacheWriteInputTokens": 0},
            "metrics": {"latencyMs": 1}}), "usage"
    else:
        candidates = t.completion - t.reasoning
        for i in range(chunks):
            last = i == chunks - 1
            so_far = candidates if last else candidates * i // chunks
            chunk = {"candidates": [{"content": {"role": "model",
                                                 "parts": [{"text": f"tok{i} "}]},
                                     **({"finishReason": "STOP"} if last else {})}],
                     "usageMetadata": gemini_usage(t, so_far), "modelVersion": MODEL}
            # Google's server-sent events end their lines with CR LF.
            yield (b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n",
                   "usage" if last else "content")
