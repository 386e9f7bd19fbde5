"""The gateway's SSE pass-through: every complete event goes on at once whatever the line ends, the usage chunk it
asked for is read (and dropped unless the client asked too), an event split over reads waits for its end."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from tachyon.gateway.app import SSEUsage  # noqa: E402

USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def _event(obj, end: bytes) -> bytes:
    return b"data: " + json.dumps(obj).encode() + end


@pytest.mark.parametrize("end", [b"\n\n", b"\r\n\r\n", b"\r\r"])
@pytest.mark.parametrize("drop", [True, False])
def test_events_pass_at_once_and_the_usage_chunk_is_read(end, drop):
    sse = SSEUsage(drop_usage_chunk=drop)
    first = _event({"choices": [{"text": "a"}], "usage": None}, end)
    assert sse.feed(first) == first  # a whole event: on at once
    second = _event({"choices": [{"text": "b"}]}, end)
    assert sse.feed(second[:7]) == b""  # half an event waits for its end
    assert sse.feed(second[7:]) == second
    usage = _event({"choices": [], "usage": USAGE}, end)
    done = b"data: [DONE]" + end
    assert sse.feed(usage + done) == (done if drop else usage + done)
    assert sse.usage == USAGE and sse.rest() == b""


def test_usage_of_a_chunk_with_choices_is_read_and_kept():
    sse = SSEUsage(drop_usage_chunk=True)
    last = _event({"choices": [{"text": "z", "finish_reason": "stop"}], "usage": USAGE}, b"\n\n")
    assert sse.feed(last) == last and sse.usage == USAGE
