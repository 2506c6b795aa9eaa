"""State that outlives one germline call: the copy's per-horizon slot.

A copy receives the whole slot of its horizon and may write only to it. Writes go to the
broker, which stores each entry with the label of everything the writer had seen, so a
value recalled later carries that label into the later call's output.

    import germline_slot
    n = germline_slot.get("count", 0)
    germline_slot.set("count", n + 1)

Outside a germline copy (sig-pin, plain runs) the slot is process memory.
"""

import json

_values = {}
_connect = None
_conn = None


def _attach(entries, connect):
    global _values, _connect, _conn
    _values = {k: v for k, v in entries.items()}
    _connect = connect
    _conn = None


def get(key, default=None):
    """The slot's value for `key`, or `default`."""
    return _values.get(key, default)


def keys():
    """The slot's keys."""
    return sorted(_values)


def set(key, value):
    """Stores a JSON-serialisable value under `key` in this horizon's slot."""
    _values[key] = value
    _send({"op": "set", "key": key, "value": value})


def delete(key):
    """Removes `key` from this horizon's slot."""
    _values.pop(key, None)
    _send({"op": "delete", "key": key})


def _send(msg):
    global _conn
    if _connect is None:
        return
    if _conn is None:
        _conn = _connect()
    _conn.sendall(json.dumps(msg).encode() + b"\n")
    # Wait for the broker's acknowledgement so a write is stored before the copy replies.
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = _conn.recv(64)
        if not chunk:
            raise RuntimeError("slot write refused by broker")
        buf += chunk
    if buf.strip() != b"ok":
        raise RuntimeError("slot write refused: " + buf.decode(errors="replace").strip())
