
# --- futex-import: appended to ../futex/server.py by the test ---
# The germline's import is release code too. A lane started while another lane's copy
# holds hr (a call found every lane busy) imports the release beside that copy: the
# import listens for 6 s, 16 words at a time (threads joined before it ends, so G1 holds;
# the mapping is read-only and its descriptor closed, so G2 and G3 hold) and keeps what it
# heard in the germline, which every copy of that lane inherits.
import time as _time
# One malloc arena for every thread: arenas the import's threads reserve stay in the
# germline's address space, and every copy's threads would find its limit reached.
_libc.mallopt(-8, 1)  # M_ARENA_MAX
_t0 = _time.monotonic()
_heard_at_import = _listen(5, 16) + " listened=%.2fs germline=%s" % (_time.monotonic() - _t0, os.urandom(4).hex())
# The listening threads are joined; let the kernel finish their exits before the
# germline's one-thread check.
threading.Event().wait(0.5)
_create = create_server


def create_server():
    m = _create()

    @m.tool()
    def imported(seconds: float = 1.0) -> str:
        threading.Event().wait(seconds)
        return _heard_at_import

    return m
