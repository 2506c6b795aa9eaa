"""State that outlives one germline call: the copy's per-horizon slot.

A copy is given the whole slot of its horizon when it first reads or writes it, and may
write only to it. Writes go to the broker, which stores each entry with the label of
everything the writer had seen, so a value recalled later carries that label into the
later call's output. While a copy holds its slot, no other call's copy is given it: every
update starts from the slot as the previous one left it. A copy that never touches its
slot is not labelled by it.

    import germline_slot
    n = germline_slot.get("count", 0)
    germline_slot.set("count", n + 1)

Outside a germline copy (sig-pin, plain runs) the slot is process memory.
"""

import json

_values = {}
_connect = None
_conn = None
_rfile = None


def _attach(connect):
    """In a copy: the slot is asked of the broker, through `connect`, at first use."""
    global _values, _connect, _conn, _rfile
    _values = None
    _connect = connect
    _conn = None
    _rfile = None


def _slot():
    global _values
    if _values is None:
        reply = json.loads(_request({"op": "get"}))
        _values = dict(reply["slot"])
    return _values


def get(key, default=None):
    """The slot's value for `key`, or `default`."""
    return _slot().get(key, default)


def keys():
    """The slot's keys."""
    return sorted(_slot())


def set(key, value):
    """Stores a JSON-serialisable value under `key` in this horizon's slot."""
    slot = _slot()
    _write({"op": "set", "key": key, "value": value})
    slot[key] = value  # once stored: a refused write leaves the copy's view as the slot is


def delete(key):
    """Removes `key` from this horizon's slot."""
    slot = _slot()
    _write({"op": "delete", "key": key})
    slot.pop(key, None)


def _request(msg):
    global _conn, _rfile
    if _conn is None:
        _conn = _connect()
        _rfile = _conn.makefile("rb")
    _conn.sendall(json.dumps(msg).encode() + b"\n")
    line = _rfile.readline()
    if not line.endswith(b"\n"):
        raise RuntimeError("slot refused by broker")
    return line


def _write(msg):
    if _connect is None:
        return
    # Wait for the broker's acknowledgement so a write is stored before the copy replies.
    reply = _request(msg).strip()
    if reply != b"ok":
        raise RuntimeError("slot write refused: " + reply.decode(errors="replace"))
