"""machine/threads.py: finding the loaded libgomp and freeing a thread's OpenMP pool without breaking torch."""

import threading

import torch

from autolade.machine.threads import loaded_libgomp, release_thread_pool

MAPS = """7f1c2a000000-7f1c2a021000 r-xp 00000000 08:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2b000000-7f1c2b040000 r-xp 00000000 08:01 5678   /venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1
7f1c2c000000-7f1c2c001000 rw-p 00000000 00:00 0
"""


def test_the_loaded_libgomp_is_read_from_the_memory_map():
    assert loaded_libgomp(MAPS) == "/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1"
    vendored = "7f00-7f01 r-xp 0 08:01 9 /venv/lib/python3.11/site-packages/torch.libs/libgomp-a34b3233.so.1.0.0\n"
    assert loaded_libgomp(vendored).endswith("libgomp-a34b3233.so.1.0.0")
    assert loaded_libgomp(MAPS.replace("libgomp.so.1", "libomp.so")) is None  # LLVM's runtime: left alone
    assert loaded_libgomp("") is None


def test_releasing_the_pool_leaves_torch_computing_the_same_in_every_thread():
    a, b = torch.randn(64, 256), torch.randn(256, 512)
    before = a @ b
    released = release_thread_pool()
    assert released == (loaded_libgomp() is not None)  # torch's Linux wheels load libgomp: True there
    assert torch.equal(a @ b, before)  # the next parallel op makes a new pool
    out = {}
    worker = threading.Thread(target=lambda: out.update(c=a @ b, freed=release_thread_pool()))
    worker.start()
    worker.join()
    assert torch.equal(out["c"], before) and out["freed"] == released
