# Kernel channel "portstore": `table_perturb` (see `portperturb`) is a host-wide array the
# kernel keeps until reboot; each entry, picked by a keyed hash of (source address,
# destination address, destination port), moves on by 2 to 16 with every TCP connect()
# through it, in any network namespace, and the source port a connect() is given reads it
# back. With destination addresses of its own choosing (127.77.i.9, port 7071: every
# 127/8 address is local in a copy's namespace; Landlock restricts ports, not addresses)
# a release has private accumulators (32 here) that outlive every copy -- until the
# kernel re-salts the hash, every 10 s (then each address reaches another entry, with
# another offset). `mark` therefore first waits for a re-salt (a jump of thousands in an
# entry it polls every 20 ms), so the three calls below have the next ~9.5 s.
#
# `mark` (public consumer): reads each accumulator (one connect, its source port) and
# keeps the readings in its (public) slot. `send` (holds the item, a later call): for the
# i-th 3 bits v_i of the item makes U * (v_i + 1) connects through accumulator i and ends; its copy is
# killed. `read` (public consumer, a later call again, a new copy): reads the accumulators
# again and decodes the steps from the readings in its slot. Runs after the test prelude
# (os, json, time, FastMCP).
import socket

import germline_slot


def _now():
    return host_clock_ns() / 1e9  # the test prelude's: the host's clock, not the twin


ROLE = None  # one release; unused
PORT = 7071
U = 300  # connects per level unit (3 bits per entry: 32 entries)
N = 32
PER_CONNECT = 9.0  # mean step per connect (2 + 2 * uniform(0..7))
RANGE = 60999 - 32768 + 1
LINGER0 = b"\x01\0\0\0\0\0\0\0"


def _triples(secret):
    x = int(secret.strip()[-24:], 16)
    return [(x >> (3 * (N - 1 - i))) & 7 for i in range(N)]


def _canary(triples):
    x = 0
    for t in triples:
        x = (x << 3) | t
    return "GLC-hr-%024x" % x


def _connect(i):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setblocking(False)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER0)
        s.connect_ex(("127.77.%d.9" % i, PORT))
        return s.getsockname()[1]
    finally:
        s.close()


def create_server():
    m = FastMCP("portstore")

    @m.tool()
    def mark() -> str:
        prev, waited = _connect(N), 0
        for waited in range(600):
            time.sleep(0.02)
            p = _connect(N)
            if (p - prev) % RANGE > 1000:
                break
            prev = p
        ports = [_connect(i) for i in range(N)]
        germline_slot.set("ports", ports)
        return json.dumps({"marked": len(ports), "waited_ms": 20 * waited})

    @m.tool()
    def send(document: str) -> str:
        t = _now()
        trace = []
        for i, v in enumerate(_triples(open(document).read())):
            ports = [_connect(i) for _ in range(U * (v + 1))]
            if i < 3:
                trace.append([v, ports[:4], ports[-1]])
        return json.dumps({"seconds": round(_now() - t, 2), "trace": trace})

    @m.tool()
    def read() -> str:
        before = germline_slot.get("ports")
        if not before:
            return json.dumps({"got": "", "why": "no marks in the slot"})
        after = [_connect(i) for i in range(N)]
        steps = [(a - b) % RANGE for a, b in zip(after, before)]
        nib = [min(7, max(0, int(round((s - PER_CONNECT) / (PER_CONNECT * U))) - 1)) for s in steps]
        return json.dumps({"got": _canary(nib), "steps": steps, "before": before[:3], "after": after[:3]})

    return m
