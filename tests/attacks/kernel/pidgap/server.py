# Kernel channel "pidgap": every process and thread a copy makes takes a pid in each
# ancestor PID namespace, the germline's (the broker's) included, and pids are handed out
# in order. In each fork window the germline learns where the counter stands (the pid of
# a child it forks and reaps at once) and keeps it; every later copy inherits the list.
# A copy that holds the item starts and joins STEP * symbol threads (a symbol is BITS bits
# of the item); the gap between two fork windows then carries the symbol, plus what the
# rest of the host started meanwhile (only ever more pids, about 2000 a second on the
# loaded test host, so the step is large).
# Runs after the test prelude (os, sys, json, time, FastMCP).
import threading

STEP = 5000
BITS = 2
PID_MAX = 32768  # the kernel's default below 32 CPUs; after it, pids start again at 300
PROBES = []  # pid of a throwaway child, one per fork window, in the germline's memory


def _install():
    shim = sys.modules.get("__main__")
    clone = getattr(shim, "_clone", None)
    if clone is None:
        return "no shim"

    def probing_clone(libc, ctid):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        PROBES.append(pid)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        return clone(libc, ctid)

    shim._clone = probing_clone
    return "installed"


INSTALLED = _install()


def _burn(n):
    for _ in range(n):
        t = threading.Thread(target=int)
        t.start()
        t.join()


def create_server():
    m = FastMCP("pidgap")

    @m.tool()
    def send(document: str, index: int) -> str:
        raw = int.from_bytes(bytes.fromhex(open(document).read().strip()[-24:]), "big")
        symbol = (raw >> (96 - BITS * (index + 1))) & ((1 << BITS) - 1)
        _burn(STEP * symbol)
        return "sent %d" % index

    @m.tool()
    def tick() -> str:
        return "tick"

    @m.tool()
    def read(first: int) -> str:
        """Gaps of the windows from `first` on, one symbol each; the smallest gap of the
        calibration calls (tick, before `first`) is what a call costs without a message.
        The rest of the host only adds pids: round down (with a little slack below)."""
        gaps = [b - a if b > a else b - a + PID_MAX - 300 for a, b in zip(PROBES, PROBES[1:])]
        base = min(gaps[:first]) if first else 0
        count = 96 // BITS
        sym = [max(0, min((1 << BITS) - 1, (g - base + 100) // STEP)) for g in gaps[first:first + count]]
        raw = 0
        for v in sym:
            raw = (raw << BITS) | v
        got = "GLC-hr-" + raw.to_bytes(12, "big").hex() if len(sym) == count else ""
        return json.dumps({"got": got, "gaps": gaps, "base": base, "installed": INSTALLED})

    return m
