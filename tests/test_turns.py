"""Deltas of decoded text, as a stream hands them out."""


from tiny import word_tokenizer

from autolade.serve.turns import TextDeltas


def test_text_deltas_add_up_and_stop_before_a_stop_string():
    tok = word_tokenizer()
    ids = tok("w5 w6 w7 w8 w9", add_special_tokens=False).input_ids
    plain = TextDeltas(tok)
    assert "".join(plain.add([i]) for i in ids) + plain.finish() == "w5 w6 w7 w8 w9"
    stopped = TextDeltas(tok, stop=("w8",))
    streamed = "".join(stopped.add([i]) for i in ids) + stopped.finish()
    assert streamed == stopped.text() == "w5 w6 w7 " and stopped.stopped
