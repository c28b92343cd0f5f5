"""OpenAI request bodies: checked field by field, refused with the field named."""

import pytest

from autolade.serve.requests import ApiError, decode_request, parse_body

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_chat_request_reads_openai_fields():
    req = decode_request({**CHAT, "max_tokens": 5, "temperature": 0, "stop": "x", "stream": True, "seed": 3,
                          "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                                       {"role": "user", "content": "hi"}],
                          "stream_options": {"include_usage": True}, "workload": "code"}, chat=True, served="m")
    assert req.messages == (("system", "be brief"), ("user", "hi"))
    assert (req.max_tokens, req.temperature, req.stop, req.stream, req.seed, req.include_usage, req.workload) == (
        5, 0.0, ("x",), True, 3, True, "code")
    assert decode_request({"model": "m", "prompt": ["abc"]}, chat=False, served="m").prompt == "abc"
    assert decode_request({**CHAT, "max_completion_tokens": 7, "n": 1, "logprobs": False}, chat=True, served="m").max_tokens == 7


@pytest.mark.parametrize("change, status, param", [
    ({"model": "other"}, 404, "model"),
    ({"model": None}, 400, "model"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": True}, 400, "max_tokens"),
    ({"temperature": -1}, 400, "temperature"),
    ({"temperature": float("nan")}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"n": 2}, 400, "n"),
    ({"logprobs": True}, 400, "logprobs"),
    ({"tools": [{"type": "function"}]}, 400, "tools"),
    ({"presence_penalty": 1}, 400, "presence_penalty"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"stream": "yes"}, 400, "stream"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format"),
])
def test_bad_fields_are_refused_by_name(change, status, param):
    with pytest.raises(ApiError) as err:
        decode_request({**CHAT, **change}, chat=True, served="m")
    assert (err.value.status, err.value.param) == (status, param)
    assert err.value.body()["error"]["param"] == param and err.value.body()["error"]["message"]


def test_malformed_json_is_a_400():
    for raw in (b"{not json", b"[1, 2]", b"\xff"):
        with pytest.raises(ApiError) as err:
            parse_body(raw)
        assert err.value.status == 400
    assert parse_body(b'{"a": 1}') == {"a": 1}
