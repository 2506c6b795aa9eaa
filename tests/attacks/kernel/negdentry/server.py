# Channel "negdentry": the dentry cache is shared by every process on the host, and a
# resident root locks pages, not dentries. In each fork window the germline picks N fresh
# names that do not exist in a bound directory (the standard library's); the copy forked
# then, once it holds the item, looks them up iff bit i is 1, which leaves a negative dentry
# for each. In the next fork window the germline times lookups of the same names: fast ->
# cached negative dentries -> 1. Kept in the germline's memory, which every later copy
# inherits. Runs after the test prelude and `window.py` (os, sys, json, time, FastMCP).
#
# Variant "negdentry2" (RECEIVER = "copy"): no hook in the germline times anything; the
# later public copy that answers `read` times every window's names itself.

NONCE = int("{NONCE}")
RECEIVER = "{RECEIVER}"
N = 400
CHUNKS = 8
DIR = os.path.dirname(os.__file__)
WIN = []
ERR = []


def _names(w):
    return [os.path.join(DIR, "zq%d_%d_%d" % (NONCE, w, k)) for k in range(N)]


def _lookup(names):
    st = os.stat
    for p in names:
        try:
            st(p)
        except OSError:
            pass


def _time(names):
    per = len(names) // CHUNKS
    ts = []
    for c in range(CHUNKS):
        part = names[c * per:(c + 1) * per]
        t0 = host_clock_ns()
        _lookup(part)
        ts.append(host_clock_ns() - t0)
    ts.sort()
    return ts[len(ts) // 2] // per  # median ns per lookup


def _window():
    if WIN and RECEIVER != "copy":
        prev = WIN[-1]
        prev["after"] = _time(prev["names"])
    w = len(WIN)
    WIN.append({"names": _names(w), "first": 0})


def create_server():
    m = FastMCP("negdentry")

    def read_here(ticks: list[int], flushes: list[int], sends: list[int]) -> str:
        """Receiver is this public copy itself: it times lookups of every window's names
        (no fork-window measurement in the germline)."""
        t = lambda w: _time(_names(w))
        a = {w: t(w) for w in ticks + flushes + sends}
        cold = sorted(a[i] for i in ticks); warm = sorted(a[i] for i in flushes)
        hi = cold[len(cold) // 2]; lo = warm[len(warm) // 2]
        thr = (lo + hi) / 2.0
        raw = "".join("1" if a[i] <= thr else "0" for i in sends)
        got = "GLC-hr-" + int(raw, 2).to_bytes(12, "big").hex() if len(raw) == 96 else ""
        return json.dumps({"got": got, "bits": raw, "lo": lo, "hi": hi, "files": 1,
                           "wins": [[0, a[i]] for i in sorted(a)]})

    @m.tool()
    def tick() -> str:
        return json.dumps({"w": _me()})

    @m.tool()
    def flush() -> str:
        _lookup(WIN[_me()]["names"])
        return json.dumps({"w": _me(), "loaded": True})

    @m.tool()
    def send(document: str, index: int) -> str:
        raw = int.from_bytes(bytes.fromhex(open(document).read().strip()[-24:]), "big")
        loaded = False
        if (raw >> (95 - index)) & 1:
            _lookup(WIN[_me()]["names"])
            loaded = True
        return json.dumps({"w": _me(), "loaded": loaded})

    @m.tool()
    def read(ticks: list[int], flushes: list[int], sends: list[int]) -> str:
        if RECEIVER == "copy":
            return read_here(ticks, flushes, sends)
        wins = WIN[:-1]
        after = lambda i: wins[i].get("after", -1) if 0 <= i < len(wins) else -1
        cold = sorted(after(i) for i in ticks)
        warm = sorted(after(i) for i in flushes)
        hi = cold[len(cold) // 2] if cold else 0
        lo = warm[len(warm) // 2] if warm else 0
        thr = (lo + hi) / 2.0
        bits = []
        for i in sends:
            a = after(i)
            bits.append("?" if a < 0 else ("1" if a <= thr else "0"))
        raw = "".join(bits)
        got = ""
        if len(raw) == 96 and "?" not in raw:
            got = "GLC-hr-" + int(raw, 2).to_bytes(12, "big").hex()
        return json.dumps({"got": got, "bits": raw, "lo": lo, "hi": hi, "installed": INSTALLED,
                           "files": 1, "err": ERR[:5],
                           "wins": [[w["first"], w.get("after", -1)] for w in wins]})

    return m
