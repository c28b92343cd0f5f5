"""DeviceClock: CUDA is synchronised before every reading, checked with a fake clock and a
stand-in for torch.cuda.synchronize on a CPU; and every decision-feeding timer reads one."""

import torch
from tiny import repetitive_prompt, tiny_llama

from autolade.config import LookaheadConfig
from autolade.engine.clock import DeviceClock
from autolade.engine.decode import lookahead_decode
from autolade.tuning.harness import Timer


class FakeCuda:
    """A clock that ticks one second per reading, and a sync that records itself in the same log."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.t = 0.0

    def now(self) -> float:
        self.events.append("read")
        self.t += 1.0
        return self.t

    def sync(self, device: torch.device) -> None:
        assert device.type == "cuda"
        self.events.append("sync")

    def clock(self, device: str = "cuda") -> DeviceClock:
        return DeviceClock(device, now_fn=self.now, sync=self.sync)


def test_cuda_reading_waits_for_the_device_first():
    fake = FakeCuda()
    clock = fake.clock("cuda:0")
    start = clock.now()
    assert clock.since(start) == 1.0
    assert fake.events == ["sync", "read", "sync", "read"]
    assert clock.cuda and clock.device == torch.device("cuda:0")


def test_cpu_reading_never_syncs():
    fake = FakeCuda()
    clock = fake.clock("cpu")
    clock.since(clock.now())
    assert fake.events == ["read", "read"] and not clock.cuda
    assert DeviceClock().now_fn is not None and DeviceClock().device == torch.device("cpu")


def test_timer_syncs_before_both_readings():
    fake = FakeCuda()
    out, secs = Timer(now=fake.now, sync=fake.sync)(torch.device("cuda"), lambda: fake.events.append("work") or 7)
    assert (out, secs) == (7, 1.0)
    assert fake.events == ["sync", "read", "work", "sync", "read"]


def test_decode_loop_times_finished_work():
    """Every reading of the step loop (prefill, policy, step, forward) is preceded by a sync."""
    fake = FakeCuda()
    model = tiny_llama()
    cfg = LookaheadConfig(window=2, ngram=3, guesses=2, prompt_lookup=6)
    out, log = lookahead_decode(model, repetitive_prompt(seed=3), config=cfg, max_new_tokens=20, clock=fake.clock())
    reads = fake.events.count("read")
    assert reads > 4 * len(log.steps)
    assert all(fake.events[i - 1] == "sync" for i, e in enumerate(fake.events) if e == "read")
    # each step: t0, tf, forward end, step end -> forward 1 tick, step 3 ticks of the fake clock
    assert {s.forward_ms for s in log.steps} == {1000.0}
    assert {s.step_ms for s in log.steps} == {3000.0}
    assert log.prefill_ms == 1000.0
    assert len(out) == 20


def test_step_curve_times_finished_work():
    from autolade.machine.step_curve import measure_step_curve

    fake = FakeCuda()
    curve = measure_step_curve(tiny_llama(), ks=[1, 4], contexts=(8,), repeats=2, warmup=0, clock=fake.clock())
    assert curve.points == {8: {1: 1000.0, 4: 1000.0}}
    assert fake.events == ["sync", "read"] * (2 * 2 * 2)  # 2 ks x 2 repeats x (start, end)
