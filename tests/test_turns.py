"""Taking turns at the model: first come first served, and deltas of decoded text."""

import threading
import time

import pytest
from tiny import word_tokenizer

from autolade.serve.turns import FairTurn, TextDeltas


def test_turns_go_round_robin_between_steps():
    turn, order, lock = FairTurn(), [], threading.Lock()

    def request(name: str, steps: int) -> None:
        ticket = turn.acquire()
        for _ in range(steps):
            with lock:
                order.append(name)
            time.sleep(0.002)
            ticket = turn.pass_on(ticket)
        turn.release(ticket)

    first = turn.acquire()  # hold the turn until both are queued, so the order is theirs alone
    threads = [threading.Thread(target=request, args=(n, 4)) for n in "ab"]
    threads[0].start()
    while turn.waiting < 1:
        time.sleep(0.001)
    threads[1].start()
    while turn.waiting < 2:
        time.sleep(0.001)
    turn.release(first)
    for t in threads:
        t.join(5)
    assert order == list("abababab")  # a long request never holds the model for more than one step at a time


def test_a_lone_request_keeps_its_turn_and_a_wrong_release_is_refused():
    turn = FairTurn()
    ticket = turn.acquire()
    assert turn.pass_on(ticket) is ticket and turn.waiting == 0
    with pytest.raises(RuntimeError):
        turn.release(object())
    turn.release(ticket)


def test_text_deltas_add_up_and_stop_before_a_stop_string():
    tok = word_tokenizer()
    ids = tok("w5 w6 w7 w8 w9", add_special_tokens=False).input_ids
    plain = TextDeltas(tok)
    assert "".join(plain.add([i]) for i in ids) + plain.finish() == "w5 w6 w7 w8 w9"
    stopped = TextDeltas(tok, stop=("w8",))
    streamed = "".join(stopped.add([i]) for i in ids) + stopped.finish()
    assert streamed == stopped.text() == "w5 w6 w7 " and stopped.stopped
