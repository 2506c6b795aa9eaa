"""germline's Python tool host.

Runs in one of two modes:

  germline  (inside the Rust-built sandbox) import the release, build its MCP server
            object, stop, then fork once per SIGUSR1 the broker sends (with
            copy_source = "spawn" the germline imports nothing of the release and
            each copy imports it after its ids check). Each
            fork makes a copy in fresh user/PID/net/IPC/mount namespaces; the copy
            connects to the broker's channel in its own network namespace, receives its
            twin inputs and slot, and continues the server's own stdio loop there.
  serve     (unprotected reference, `--runtime sig-pin`) the same server on real stdio.

Nothing in this file is trusted: the release runs in the same interpreter and may
rewrite any of it. Every guarantee is imposed before exec or checked from outside.
"""

import ctypes
import hashlib
import importlib
import io
import json
import os
import signal
import socket
import sys
import time

CONTROL_FD = 3
CHANNEL_PORT = 7070
SLOT_PORT = 7071


# --- twin inputs -----------------------------------------------------------------
# Installed before the release is imported, so `from time import time` and
# `from datetime import datetime` in release code bind the twin-aware versions. Inactive
# (real clock) in the germline; activated per copy with the broker's frozen values.

class _Twin:
    active = False
    clock = 0.0
    counter = 0
    counted_only = False
    real_start_ns = 0
    stream = b""
    stream_counter = 0


_twin = _Twin()
_real = {
    "time": time.time,
    "time_ns": time.time_ns,
    "monotonic": time.monotonic,
    "monotonic_ns": time.monotonic_ns,
    "perf_counter": time.perf_counter,
    "perf_counter_ns": time.perf_counter_ns,
    "localtime": time.localtime,
    "gmtime": time.gmtime,
    "ctime": time.ctime,
    "strftime": time.strftime,
    "asctime": time.asctime,
    "clock_gettime": time.clock_gettime,
    "clock_gettime_ns": time.clock_gettime_ns,
    "urandom": os.urandom,
    "getrandom": os.getrandom,
}


# Clock ids `time.clock_gettime` answers from the twin inputs: the wall-clock family from
# the frozen clock, the monotonic family from the twin monotonic clock. CPU-time clocks
# (process, thread) measure the copy's own work and stay real (SECURITY.md, "Twin inputs").
def _clock_ids(*names):
    return frozenset(getattr(time, n) for n in names if hasattr(time, n))


_WALL_CLOCKS = _clock_ids("CLOCK_REALTIME", "CLOCK_REALTIME_COARSE")
_MONO_CLOCKS = _clock_ids("CLOCK_MONOTONIC", "CLOCK_MONOTONIC_RAW", "CLOCK_MONOTONIC_COARSE", "CLOCK_BOOTTIME")
# CLOCK_TAI runs a fixed whole number of seconds ahead of the wall clock (0 until the
# host's time daemon sets it): host configuration, read once in the germline.
_TAI_OFFSET = (
    round(time.clock_gettime(time.CLOCK_TAI) - time.clock_gettime(time.CLOCK_REALTIME))
    if hasattr(time, "CLOCK_TAI")
    else None
)


# The twin monotonic clock (time.monotonic, perf_counter and their _ns forms, one clock):
# a frozen base of 1 s plus a deterministic model of elapsed time — 1 us per read, plus
# exactly the duration each time.sleep asked for — so every copy and every probe or control
# replay of the same code path reads the same values, and
# `while time.monotonic() < deadline: time.sleep(0.05)` ends after as many rounds as it
# would unprotected. The model never falls more than _TWIN_SLACK_NS behind real time since
# the twin inputs were activated: waits the model does not see (asyncio.sleep, Event.wait,
# select, long computation) still end, at most that slack late. Only then do readings
# depend on real time; a release that sends such readings to a host is nondeterministic in
# the replay model, which its control replay shows (unverified, never an item witness).
_TWIN_BASE_NS = 1_000_000_000
_TWIN_SLACK_NS = 250_000_000


def _tick_ns():
    _twin.counter += 1000
    if not _twin.counted_only:
        floor = _real["monotonic_ns"]() - _twin.real_start_ns - _TWIN_SLACK_NS
        if _twin.counter < floor:
            _twin.counter = floor
    return int(_TWIN_BASE_NS + _twin.counter)


def _twin_sleep(secs):
    if _twin.active and not _twin.counted_only and secs > 0:
        _twin.counter += int(secs * 1e9)
    _real_sleep(secs)


def _patch_time():
    def t():
        return _twin.clock if _twin.active else _real["time"]()

    def t_ns():
        return int(_twin.clock * 1e9) if _twin.active else _real["time_ns"]()

    def mono():
        return _tick_ns() / 1e9 if _twin.active else _real["monotonic"]()

    def mono_ns():
        return _tick_ns() if _twin.active else _real["monotonic_ns"]()

    def perf():
        return _tick_ns() / 1e9 if _twin.active else _real["perf_counter"]()

    def perf_ns():
        return _tick_ns() if _twin.active else _real["perf_counter_ns"]()

    def localtime(secs=None):
        return _real["localtime"](t() if secs is None else secs)

    def gmtime(secs=None):
        return _real["gmtime"](t() if secs is None else secs)

    def ctime(secs=None):
        return _real["ctime"](t() if secs is None else secs)

    def strftime(fmt, tt=None):
        return _real["strftime"](fmt, localtime() if tt is None else tt)

    def asctime(tt=None):
        return _real["asctime"](localtime() if tt is None else tt)

    # Clock id -> (seconds, nanoseconds) while twin inputs are active.
    twin_clocks = {c: (t, t_ns) for c in _WALL_CLOCKS}
    twin_clocks.update({c: (mono, mono_ns) for c in _MONO_CLOCKS})
    if _TAI_OFFSET is not None:
        twin_clocks[time.CLOCK_TAI] = (lambda: t() + _TAI_OFFSET, lambda: t_ns() + _TAI_OFFSET * 1_000_000_000)

    def clock_gettime(clk):
        twin = _twin.active and twin_clocks.get(clk)
        return twin[0]() if twin else _real["clock_gettime"](clk)

    def clock_gettime_ns(clk):
        twin = _twin.active and twin_clocks.get(clk)
        return twin[1]() if twin else _real["clock_gettime_ns"](clk)

    time.time, time.time_ns = t, t_ns
    time.sleep = _twin_sleep
    time.monotonic, time.monotonic_ns = mono, mono_ns
    time.perf_counter, time.perf_counter_ns = perf, perf_ns
    time.localtime, time.gmtime, time.ctime, time.strftime = localtime, gmtime, ctime, strftime
    time.asctime = asctime
    time.clock_gettime, time.clock_gettime_ns = clock_gettime, clock_gettime_ns


# datetime.datetime.now and utcnow read the system clock in C (time.time is not asked).
# Replacing the datetime.datetime type with a Python subclass breaks every C extension that
# checks the type's size or identity at import (pandas, numpy's datetime support, ...), so
# instead the copy keeps the C type and puts two classmethods into its own attribute
# dictionary (read through the gc, as the type refuses setattr), then tells the interpreter
# the type changed so no cached lookup keeps the C entries. Installed before the release is
# imported (so `now = datetime.now` at import is twin-aware too); without active twin
# inputs, and for anything but `now()` / `now(tz)` with `tz` None or a tzinfo, the real
# methods answer (and raise as unprotected).
def _install_datetime_clock():
    import datetime as _dt
    import gc

    cls = _dt.datetime
    real = cls.__dict__
    real_now, real_utcnow = real.get("now"), real.get("utcnow")
    if type(real_now).__name__ != "classmethod_descriptor" or type(real_utcnow).__name__ != "classmethod_descriptor":
        return
    attrs = [r for r in gc.get_referents(real) if isinstance(r, dict)]
    if len(attrs) != 1:
        return

    def now(klass, *args, **kwargs):
        tz = args[0] if args else kwargs.get("tz")
        valid = len(args) + len(kwargs) <= 1 and set(kwargs) <= {"tz"}
        if _twin.active and valid and (tz is None or isinstance(tz, _dt.tzinfo)):
            return klass.fromtimestamp(_twin.clock, tz)
        return real_now.__get__(None, klass)(*args, **kwargs)

    def utcnow(klass, *args, **kwargs):
        if args or kwargs or not _twin.active:
            return real_utcnow.__get__(None, klass)(*args, **kwargs)
        return klass.utcfromtimestamp(_twin.clock)

    now.__doc__, utcnow.__doc__ = real_now.__doc__, real_utcnow.__doc__
    attrs[0]["now"], attrs[0]["utcnow"] = classmethod(now), classmethod(utcnow)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(cls))


def _twin_urandom(n):
    if not _twin.active:
        return _real["urandom"](n)
    out = b""
    while len(out) < n:
        _twin.stream_counter += 1
        out += hashlib.sha256(_twin.stream + _twin.stream_counter.to_bytes(8, "big")).digest()
    return out[:n]


def _twin_getrandom(size, flags=0):
    if not _twin.active:
        return _real["getrandom"](size, flags)
    _real["getrandom"](0, flags)  # the real call's argument checks and errors
    if size < 0:
        raise ValueError("negative argument not allowed")
    return _twin_urandom(size)


def _patch_random():
    import random

    os.urandom = _twin_urandom
    os.getrandom = _twin_getrandom
    random._urandom = _twin_urandom
    # `random.Random()` and `seed()` with no argument seed from the kernel in C, not through
    # os.urandom: with twin inputs active they seed from the twin stream.
    real_seed = random.Random.seed

    def seed(self, a=None, version=2):
        if a is None and _twin.active:
            a = _twin_urandom(32)
        return real_seed(self, a, version)

    seed.__doc__ = real_seed.__doc__
    random.Random.seed = seed
    random.seed = random._inst.seed


def _activate_twin(twin):
    _twin.clock = float(twin["clock"])
    _twin.counter = 0
    _twin.real_start_ns = _real["monotonic_ns"]()
    _twin.stream = bytes.fromhex(twin["seed"])
    _twin.stream_counter = 0
    _twin.active = True
    import random

    random.seed(_twin.stream)
    # uuid1 asks libuuid (real time, real random node) when it can; its Python path reads
    # time.time_ns and the seeded `random`, and a node from the twin stream.
    uuid = sys.modules.get("uuid")
    if uuid is not None:
        uuid._generate_time_safe = None
        uuid._last_timestamp = None
        uuid._node = int.from_bytes(_twin_urandom(6), "big") | (1 << 40)
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed(int.from_bytes(_twin.stream[:4], "big"))
        except Exception:
            pass


# --- the release -----------------------------------------------------------------

def _load_manifest(release_dir):
    import tomllib

    with open(os.path.join(release_dir, "germline.toml"), "rb") as f:
        return tomllib.load(f)


def _fill_items(text):
    # The deployment's values of the manifest's item placeholders `{item:NAME}` (germline
    # checked that each has one before it started the germline).
    for name, value in json.loads(os.environ.get("GERMLINE_STARTUP_ITEMS", "{}")).items():
        text = text.replace("{item:%s}" % name, value)
    return text


def _build_server(release_dir):
    rel = _load_manifest(release_dir)["release"]
    rel["args"] = [_fill_items(a) for a in rel.get("args", [])]
    for p in reversed(rel.get("python_path", ["."])):
        sys.path.insert(0, os.path.normpath(os.path.join(release_dir, p)))
    if "factory" in rel:
        mod, _, attr = rel["factory"].partition(":")
        args = [_fill_items(a) if isinstance(a, str) else a for a in json.loads(rel.get("factory_args", "[]"))]
        return getattr(importlib.import_module(mod), attr)(*args)
    if "main" in rel:
        # Servers that build themselves inside an async main(): import in the germline
        # (the expensive part), run main in each copy on the copy's stdio.
        mod, _, attr = rel["main"].partition(":")
        args = [_fill_items(a) if isinstance(a, str) else a for a in json.loads(rel.get("main_args", "[]"))]
        return _Main(getattr(importlib.import_module(mod), attr), args)
    if "cli" in rel:
        # A server's command-line entry point: import its module in the germline, run it
        # in each copy with the manifest's argv (it serves stdio itself).
        mod, _, attr = rel["cli"].partition(":")
        return _Cli(getattr(importlib.import_module(mod), attr), [rel["name"]] + list(rel.get("args", [])))
    mod = importlib.import_module(rel["module"])
    return getattr(mod, rel.get("attribute", "server"))


class _Main:
    def __init__(self, fn, args):
        self.fn = fn
        self.args = args


class _Cli:
    def __init__(self, fn, argv):
        self.fn = fn
        self.argv = argv


async def _serve_stdio(server):
    if isinstance(server, _Main):
        await server.fn(*server.args)
        return
    if hasattr(server, "run_stdio_async"):
        # FastMCP (mcp 1.x) and MCPServer (mcp 2.x) run their own stdio loop.
        await server.run_stdio_async()
        return
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _run_server(server):
    if isinstance(server, _Cli):
        # Its own event loop (often asyncio.run) and exit, as from its console script.
        sys.argv = list(server.argv)
        server.fn()
        return
    import anyio

    anyio.run(_serve_stdio, server)


def _preload(server):
    # What every copy needs, imported once in the germline so copies don't pay for it.
    import anyio  # noqa: F401
    import anyio._backends._asyncio  # noqa: F401
    import asyncio  # noqa: F401
    import mcp.server.stdio  # noqa: F401
    try:
        import mcp.server.fastmcp  # noqa: F401
    except ImportError:
        pass
    import urllib.request  # noqa: F401
    import germline_slot  # noqa: F401
    _warm_sdk()
    _warm_session(server)


def _warm_sdk():
    """Does, once in the germline, data-free work every copy would otherwise repeat at
    its first message: the SDK's package-version lookup (a file read per `initialize`),
    the generic stream types it subscripts, and parsing the shapes of the messages the
    broker sends. Nothing here runs release code or keeps a descriptor or thread."""
    import functools
    import importlib.metadata as md

    if not hasattr(md.version, "cache_info"):
        md.version = functools.lru_cache(maxsize=256)(md.version)
    try:
        md.version("mcp")
    except Exception:
        pass
    try:
        import anyio
        import mcp.types as types
        from mcp.shared.message import SessionMessage

        for kind in (SessionMessage | Exception, SessionMessage, types.JSONRPCResponse | types.JSONRPCError):
            for stream in anyio.create_memory_object_stream[kind](0):
                stream.close()
        for line in _WARM_LINES + _WARM_SDK_HANDLED + (_WARM_RESULT,):
            msg = types.JSONRPCMessage.model_validate_json(line)
            msg.model_dump_json(by_alias=True, exclude_none=True)
    except Exception:
        pass


_WARM_LINES = (
    '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    '"capabilities":{},"clientInfo":{"name":"germline","version":"0"}}}',
    '{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}',
    '{"jsonrpc":"2.0","id":2,"method":"ping"}',
)
# Answered by the SDK itself where the server is FastMCP (its handlers, not the release's).
_WARM_SDK_HANDLED = (
    '{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}',
    '{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"germline warm-up","arguments":{}}}',
)
# The shape of a tool's answer (parsed by `_warm_sdk`, never sent).
_WARM_RESULT = '{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"x"}],"isError":false}}'


def _warm_session(server):
    """One data-free MCP session with the release's server, in the germline, over in-memory
    streams: `initialize` and `ping`, and where the SDK's own handlers answer them (FastMCP)
    `tools/list` and a call of a tool no server has. As it answers, the interpreter
    specializes the bytecode of the request path and the SDK fills its caches; done here,
    every copy is forked with that done instead of writing it into pages it copies on write
    (measured on the noop release: about 15% fewer page faults per copy).

    No handler of the release runs: only the SDK's own server classes are warmed (not a
    subclass), and not when their lifespan is not the SDK's default (release code that runs
    with every session, and may open its data); for those, and for servers the germline
    cannot reach in memory (`main`, `cli`), a server of the shim's own making is warmed
    instead (`_warm_own_server`). Nothing is kept: the answers are
    dropped, the event loop closes its descriptors, no thread is started (G1 and G2 check
    the germline after this as before). Any failure just leaves the copies to do it."""
    lowlevel = None
    if not isinstance(server, (_Main, _Cli)):
        lowlevel = getattr(server, "_mcp_server", None) if hasattr(server, "run_stdio_async") else server
    try:
        sdk = sys.modules[type(lowlevel).__module__]
        package = type(lowlevel).__module__.rpartition(".server.lowlevel")[0]
        # The SDK's own classes, not a subclass whose methods are the release's.
        if not package or type(lowlevel) is not getattr(sdk, "Server", None):
            raise LookupError
        if lowlevel is not server and not type(server).__module__.startswith(package + ".server."):
            raise LookupError
        if lowlevel.lifespan is not getattr(sdk, "lifespan", None):
            raise LookupError
        lines = _WARM_LINES + (_WARM_SDK_HANDLED if lowlevel is not server else ())
    except Exception:
        # Not reachable in memory (`main`, `cli`) or not the SDK's own: a server of the
        # shim's own making, from the SDK the release imported, is warmed instead.
        _warm_own_server()
        return
    _run_warm_session(package, lowlevel, lines)


def _warm_own_server():
    """One data-free session, in the germline, with a server the shim makes from the SDK
    the release imported (its low-level `Server`, one tool that answers a constant): the
    SDK's request path — session, validation, dispatch, the answer's serialisation — is
    specialized and its caches filled before the fork, for a server built only in each copy
    (`main`, `cli`) or not warmed itself. No code of the release runs."""
    package = "mcp"
    try:
        lowlevel_mod = importlib.import_module(package + ".server.lowlevel")
        types = importlib.import_module(package + ".types")
        own = lowlevel_mod.Server("germline warm-up")

        @own.list_tools()
        async def _tools():
            return [types.Tool(name="germline warm-up", description="", inputSchema={"type": "object", "properties": {}})]

        @own.call_tool()
        async def _call(name, arguments):
            return [types.TextContent(type="text", text="x")]

    except Exception:
        return
    _run_warm_session(package, own, _WARM_LINES + _WARM_SDK_HANDLED)


def _run_warm_session(package, lowlevel, lines):
    try:
        types = importlib.import_module(package + ".types")
        message = importlib.import_module(package + ".shared.message")
        import anyio
    except Exception:
        return

    async def session():
        to_server, server_reads = anyio.create_memory_object_stream(len(lines))
        server_writes, from_server = anyio.create_memory_object_stream(len(lines))
        async with anyio.create_task_group() as tg:
            tg.start_soon(lowlevel.run, server_reads, server_writes, lowlevel.create_initialization_options())
            with anyio.fail_after(5):
                for line in lines:
                    await to_server.send(message.SessionMessage(types.JSONRPCMessage.model_validate_json(line)))
                    if '"id"' not in line:
                        continue
                    # Until its answer (the server may send notifications first); bounded.
                    for _ in range(16):
                        got = await from_server.receive()
                        if isinstance(got, message.SessionMessage) and hasattr(got.message.root, "id"):
                            break
            tg.cancel_scope.cancel()

    try:
        anyio.run(session)
    except Exception:
        pass


# --- forking copies --------------------------------------------------------------

_CLONE_FLAGS = (
    0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x08000000  # CLONE_NEWIPC
    | 0x00020000  # CLONE_NEWNS
    | 0x04000000  # CLONE_NEWUTS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x01000000  # CLONE_CHILD_SETTID
    | signal.SIGCHLD
)
_SYS_clone = 56
_SYS_gettid = 186


def _tid_field():
    """Address of glibc's cached tid in struct pthread, so the copy's is set by the kernel."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.pthread_self.restype = ctypes.c_void_p
    base = libc.pthread_self()
    tid = libc.syscall(_SYS_gettid)
    words = (ctypes.c_int * 256).from_address(base)
    hits = [i for i in range(256) if words[i] == tid]
    return base + hits[0] * 4 if len(hits) == 1 else None


def _clone(libc, ctid):
    py = ctypes.pythonapi
    py.PyOS_BeforeFork()
    flags = _CLONE_FLAGS if ctid else _CLONE_FLAGS & ~0x01000000
    pid = libc.syscall(_SYS_clone, ctypes.c_ulong(flags), None, None, ctypes.c_void_p(ctid or 0), None)
    if pid == 0:
        py.PyOS_AfterFork_Child()
    else:
        py.PyOS_AfterFork_Parent()
    return pid


def _wait_channel_ready(budget=10.0):
    """Sleeps until the broker signals (SIGUSR2, blocked since the fork) that this copy's
    listeners exist, so the first connection succeeds without retry back-offs."""
    try:
        signal.sigtimedwait({signal.SIGUSR2}, budget)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})


def _connect_channel(port, budget=10.0):
    deadline = _real["monotonic"]() + budget
    delay = 0.00005
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect(("127.0.0.1", port))
            return s
        except OSError:
            s.close()
            if _real["monotonic"]() > deadline:
                raise
            _real_sleep(delay)
            delay = min(delay * 2, 0.001)


_real_sleep = time.sleep


def _read_line(rfile, limit=64 << 20):
    """One newline-terminated line from the buffered channel (what follows stays buffered
    for the MCP loop that reads the same file)."""
    line = rfile.readline(limit + 1)
    if not line.endswith(b"\n"):
        if len(line) > limit:
            raise ValueError("preamble too large")
        raise EOFError("broker closed the channel")
    return line


def _landlock_copy_layer():
    """A Landlock domain of the copy's own, on top of the germline's.

    Defence in depth only (a hostile germline may skip it; nothing relies on it): a new
    domain per copy makes Landlock's signal and abstract-socket scoping separate this
    copy from every sibling, not just from the outside world.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    class Attr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]

    class NetPort(ctypes.Structure):
        _fields_ = [("allowed", ctypes.c_uint64), ("port", ctypes.c_uint64)]

    fs_all = (1 << 16) - 1  # every filesystem right up to ABI 5/6
    read = 0x1 | 0x4 | 0x8  # EXECUTE | READ_FILE | READ_DIR
    attr = Attr(fs_all, 0x1 | 0x2, 0x1 | 0x2)
    rs = libc.syscall(444, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
    if rs < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        rules = [("/", read), ("/dev/null", 0x2 | 0x4)]
        scratch = os.environ.get("GERMLINE_SCRATCH")
        if scratch:
            # The copy's own scratch tmpfs (mounted there by the broker; the rule sits on
            # its parent, as Landlock skips mount points): write, truncate, make and remove
            # regular files, directories and links, rename (refer).
            rules.append((os.path.dirname(scratch), 0x2 | 0x10 | 0x20 | 0x80 | 0x100 | 0x1000 | 0x2000 | 0x4000))
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = PathBeneath(rights, fd)
                if libc.syscall(445, rs, 1, ctypes.byref(rule), 0) < 0:
                    raise OSError(ctypes.get_errno(), "landlock_add_rule " + path)
            finally:
                os.close(fd)
        for port in (3128, CHANNEL_PORT, SLOT_PORT):
            rule = NetPort(0x2, port)
            if libc.syscall(445, rs, 2, ctypes.byref(rule), 0) < 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule port")
        if libc.syscall(446, rs, 0) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(rs)


def _take_copy_ids():
    """Becomes this copy's own ids and gives up every capability, before any data.

    The broker has mapped root of the copy's user namespace to host ids of this copy's own
    (by the time it signals the channel ready); switching to them keeps kernel counters
    kept per host user apart from every other copy's and the germline's. The broker checks
    the result from /proc and gives the copy its view only then.
    """
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (ctypes.c_uint32 * 6)()
    if libc.syscall(126, header, data) < 0:  # capset
        raise OSError(ctypes.get_errno(), "capset")


def _run_copy(server, release_dir):
    """A copy's life. `server` is None with copy_source = "spawn": the germline never
    imported the release, and the copy imports it itself once it runs as its own ids
    (checked by the broker before anything but the preamble reaches it), so threads the
    import starts are the copy's and inherit those ids."""
    t0 = _real["perf_counter"]()
    # A handler the release set in the germline runs no earlier than the call's twin
    # inputs: SIGCONT (which lets a stopped pooled copy run) is held until they are taken.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCONT})
    _landlock_copy_layer()
    _wait_channel_ready()
    _take_copy_ids()
    chan = _connect_channel(CHANNEL_PORT)
    t1 = _real["perf_counter"]()
    rfile = chan.makefile("rb")
    preamble = json.loads(_read_line(rfile))
    if preamble.get("pool"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCONT})
        _run_pooled(server, chan, rfile, release_dir)
        return
    if preamble.get("twin") is None:
        # Twin inputs switched off (a test of what they do): real clock and entropy.
        _twin.active = False
    if preamble.get("trace"):
        print("copy: connected after %.2f ms, preamble after %.2f ms" % ((t1 - t0) * 1e3, (_real["perf_counter"]() - t0) * 1e3), file=sys.stderr)
    if preamble.get("twin") is not None:
        # "counted" (a test switch, EvidenceSwitches::counted_twin_clock): the earlier
        # clock that advanced 1 us per read only, which hangs polling loops.
        _twin.counted_only = preamble.get("twin_clock") == "counted"
        _activate_twin(preamble["twin"])
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCONT})
    if preamble.get("germline") == "start":
        # A pooled copy readied short of starting its server (one that opens its data at
        # start-up): the broker mounts the call's view once the twin inputs are taken, then
        # lets the server start.
        if preamble.get("reply"):
            chan.sendall(_READY)
        if json.loads(_read_line(rfile)).get("germline") != "data":
            raise SystemExit("germline: expected the go-ahead after the start line")
    import germline_slot

    germline_slot._attach(lambda: _connect_channel(SLOT_PORT))
    for k, v in preamble.get("env", {}).items():
        os.environ[k] = v
    wfile = chan.makefile("wb")
    _copy_io["channel"] = chan
    _capture_stderr()  # after the copy took its own ids: made by them
    if server is None:
        server = _build_server(release_dir)
    sys.stdin = io.TextIOWrapper(rfile, encoding="utf-8")
    # Buffered like stdout on a pipe: a server's stray print stays in the buffer as it
    # does unprotected, instead of landing in the middle of the MCP stream.
    sys.stdout = io.TextIOWrapper(wfile, encoding="utf-8")
    _channel_transport(chan, rfile, control=False)
    if preamble.get("trace"):
        print("copy: server loop starts after %.2f ms" % ((_real["perf_counter"]() - t0) * 1e3), file=sys.stderr)
    _run_server(server)


class _PooledStdin(io.RawIOBase):
    """A pooled copy's stdin: the channel, less the broker's two control lines.

    A pooled copy starts its server and answers `initialize` before it holds anything; a
    call then arrives as `{"germline": "twin", ...}` (twin inputs: activated here, in the
    thread that reads stdin, and acknowledged when the broker has a view to mount next),
    then `{"germline": "data"}` right before `tools/call` (the slot is asked of the broker
    at its first use). Both are handled before the next line reaches the server, so no
    release code of the call runs before its twin inputs. Lines are passed on whole, in
    order.
    """

    def __init__(self, rfile, chan):
        self._rfile = rfile
        self._chan = chan
        self._pending = b""

    def readable(self):
        return True

    def readinto(self, buf):
        while not self._pending:
            line = self._rfile.readline(64 << 20)
            if not line:
                return 0
            if line.startswith(b'{"germline"'):
                self._control(json.loads(line))
                continue
            self._pending = line
        n = min(len(buf), len(self._pending))
        buf[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _control(self, msg):
        if _take_control(msg):
            self._chan.sendall(_READY)


_READY = b'{"germline":"ready"}\n'


def _take_control(msg):
    """Acts on one of the broker's control lines to a pooled copy; true when the broker
    waits for `_READY` (it mounts the call's view only once the twin inputs are taken)."""
    if msg["germline"] == "twin":
        if msg.get("twin") is None:
            _twin.active = False
        else:
            _twin.counted_only = msg.get("twin_clock") == "counted"
            _activate_twin(msg["twin"])
        return bool(msg.get("reply", True))
    if msg["germline"] == "data":
        import germline_slot

        germline_slot._attach(lambda: _connect_channel(SLOT_PORT))
        for k, v in msg.get("env", {}).items():
            os.environ[k] = v
    return False


class _ChannelLines:
    """The channel as the SDK's stdin stream, read on the server's own event loop.

    `stdio_server()` otherwise reads stdin line by line in an anyio worker thread and
    writes stdout in another, two thread hand-offs per message. Lines are passed on whole
    and in order; with `control` (a pooled copy) the broker's control lines are taken
    here, before the next line reaches the server, exactly as `_PooledStdin` does.
    """

    def __init__(self, chan, pending, control):
        self._chan = chan
        self._buf = bytearray(pending)
        self._scan = 0
        self._eof = False
        self._control = control

    def __aiter__(self):
        return self

    async def __anext__(self):
        import asyncio

        while True:
            end = self._buf.find(b"\n", self._scan)
            if end < 0 and self._eof:
                if not self._buf:
                    raise StopAsyncIteration
                end = len(self._buf) - 1
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                self._scan = 0
                if self._control and line.startswith(b'{"germline"'):
                    if _take_control(json.loads(line)):
                        await asyncio.get_running_loop().sock_sendall(self._chan, _READY)
                    continue
                return line.decode("utf-8", "replace")
            self._scan = len(self._buf)
            data = await asyncio.get_running_loop().sock_recv(self._chan, 1 << 16)
            if data:
                self._buf += data
            else:
                self._eof = True


class _ChannelWriter:
    """The channel as the SDK's stdout stream, written on the server's own event loop."""

    def __init__(self, chan):
        self._chan = chan

    async def write(self, text):
        import asyncio

        await asyncio.get_running_loop().sock_sendall(self._chan, text.encode("utf-8"))
        return len(text)

    async def flush(self):
        pass


def _channel_transport(chan, rfile, control):
    """Makes the SDK's `stdio_server()` (any release's copy of it, however imported) serve
    this copy's channel on the event loop when called without streams. Left alone if the
    SDK is not loaded or its signature is not the one known here: the server then reads
    `sys.stdin` and writes `sys.stdout`, which are the same channel."""
    mod = sys.modules.get("mcp.server.stdio")
    fn = getattr(getattr(mod, "stdio_server", None), "__wrapped__", None)
    code = getattr(fn, "__code__", None)
    if code is None or code.co_varnames[:2] != ("stdin", "stdout") or fn.__defaults__ != (None, None):
        return
    chan.setblocking(False)
    # What the buffered reader already holds (the broker's first lines can arrive with
    # the preamble); on the non-blocking socket this takes nothing more from the kernel.
    pending = rfile.read1(1 << 20) or b""
    fn.__defaults__ = (_ChannelLines(chan, pending, control), _ChannelWriter(chan))


def _run_pooled(server, chan, rfile, release_dir):
    wfile = chan.makefile("wb")
    _copy_io["channel"] = chan
    _capture_stderr()
    if server is None:
        server = _build_server(release_dir)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(_PooledStdin(rfile, chan)), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(wfile, encoding="utf-8")
    _channel_transport(chan, rfile, control=True)
    _run_server(server)


def _close_stdio():
    keep = (2,) if os.environ.get("GERMLINE_KEEP_STDERR") == "1" else ()
    for fd in (0, 1, 2):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


# A copy's stderr: an unnamed file in its own scratch (unless GERMLINE_KEEP_STDERR), whose
# last lines go to the broker as one notification when the copy's server fails, so the
# failure can name its cause. The copy's error carries the copy's label, and so does this
# text. Not a memfd: memfd_create is refused (a tmpfs inode moves the host's timestamp
# floor); the scratch is ramfs where the copy has a memory limit.
_copy_io = {}
_STDERR_TAIL = 4096


def _capture_stderr():
    if os.environ.get("GERMLINE_KEEP_STDERR") == "1":
        return
    scratch = os.environ.get("TMPDIR")
    if not scratch:
        return
    try:
        fd = os.open(scratch, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    os.dup2(fd, 2, inheritable=True)
    os.close(fd)
    _copy_io["stderr"] = 2


def _report_stderr():
    chan = _copy_io.get("channel")
    if os.environ.get("GERMLINE_KEEP_STDERR") == "1":
        import traceback

        traceback.print_exc()  # debugging: the broker's own stderr
    if chan is None or "stderr" not in _copy_io:
        return
    try:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        size = os.fstat(2).st_size
        tail = os.pread(2, _STDERR_TAIL, max(0, size - _STDERR_TAIL)).decode("utf-8", "replace")
        note = {"jsonrpc": "2.0", "method": "notifications/germline/stderr", "params": {"text": tail}}
        chan.setblocking(True)
        chan.sendall(json.dumps(note).encode() + b"\n")
        # Read what the broker sent and the server never did, then end the stream: a socket
        # closed with unread data resets the connection, and the reset can overtake the
        # notification.
        chan.setblocking(False)
        try:
            while chan.recv(65536):
                pass
        except OSError:
            pass
        chan.shutdown(socket.SHUT_WR)
    except BaseException:
        pass


def _own_stdio():
    """Fresh /dev/null descriptions on 0-2 for this copy alone."""
    keep = (2,) if os.environ.get("GERMLINE_KEEP_STDERR") == "1" else ()
    for fd in (0, 1, 2):
        if fd in keep:
            continue
        null = os.open("/dev/null", os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)


def _enter_pid_namespace():
    """Makes this process the germline inside the PID namespace the broker's pre-exec step
    created for its children (it is not in it itself: only processes born there are).

    Forks the keeper first, the namespace's init: it only reaps. A process the germline
    leaves behind is reparented to the keeper, where the broker sees it as the keeper's
    child and refuses the germline, and killing the keeper tears the whole namespace
    down. Then forks the germline, which continues here, PID 2 of the namespace, so the
    copies it forks get PID namespaces nested inside it. The first process waits for the
    germline and exits with it. All of this happens before the release is imported: no
    release code ever runs in the keeper or the first process.

    Nothing outlives the broker: the keeper dies with the first process (parent-death
    signal), and the first process polls a pidfd of the broker and kills the keeper (and
    with it the whole namespace) when the broker is gone, even by SIGKILL.
    """
    # Read here and kept from the keeper, the germline and its copies: a pidfd of the
    # broker, which the broker opened (no process in the sandbox may open one).
    broker = os.environ.pop("GERMLINE_BROKER_PIDFD", None)
    broker = int(broker) if broker else None
    alive_r, alive_w = os.pipe()
    keeper = os.fork()
    if keeper == 0:
        try:
            os.close(alive_w)
            if broker is not None:
                os.close(broker)
            _die_with_parent(alive_r)
            chld = {signal.SIGCHLD}
            signal.pthread_sigmask(signal.SIG_BLOCK, chld)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _close_stdio()
            while True:
                try:
                    while os.waitpid(-1, os.WNOHANG)[0] > 0:
                        pass
                except ChildProcessError:
                    pass
                signal.sigwait(chld)
        finally:
            os._exit(0)
    os.close(alive_r)
    germline = os.fork()
    if germline == 0:
        os.close(alive_w)
        if broker is not None:
            os.close(broker)
        # Stdout is the first process's report pipe to the broker: not the germline's.
        null = os.open("/dev/null", os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
        return
    broker = _broker_pidfd(keeper, germline, broker) if os.environ.get("GERMLINE_BROKER_WATCH") != "0" else None
    code = 1
    try:
        # Keeps stdout: each stop of the germline is reported there as one byte, so the
        # broker sleeps until then (it reads the stop itself from /proc).
        keep = (1, 2) if os.environ.get("GERMLINE_KEEP_STDERR") == "1" else (1,)
        for fd in (0, 1, 2):
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.set_blocking(1, False)
        # One thread (this process may not start another: its children's PID namespace
        # is not its own): SIGCHLD wakes a poll that also watches the broker.
        import select

        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        p = select.poll()
        p.register(wake_r, select.POLLIN)
        if broker is not None:
            p.register(broker, select.POLLIN)
        while True:
            try:
                pid, status = os.waitpid(germline, os.WUNTRACED | os.WNOHANG)
            except InterruptedError:
                continue
            except ChildProcessError:
                break
            if pid == 0:
                for fd, _ in p.poll():
                    if fd == broker:
                        # The broker is gone: so is everything it started.
                        for child in (keeper, germline):
                            try:
                                os.kill(child, signal.SIGKILL)
                            except OSError:
                                pass
                        os._exit(1)
                    try:
                        while os.read(wake_r, 64):
                            pass
                    except BlockingIOError:
                        pass
                continue
            if os.WIFSTOPPED(status):
                try:
                    os.write(1, b"s")
                except OSError:
                    pass
                continue
            code = os.waitstatus_to_exitcode(status)
            break
    finally:
        # A germline killed by a signal: 128 + the signal, as a shell reports it.
        os._exit(code if code >= 0 else 128 - code)


def _die_with_parent(alive):
    """SIGKILL when the parent ends; leaves now if it already has. The parent (outside
    this PID namespace, so getppid() says 0) holds the write end of the pipe `alive`: a
    hang-up there means it ended before the parent-death signal was set."""
    import select

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        os._exit(1)
    p = select.poll()
    p.register(alive, select.POLLIN)
    if p.poll(0):
        os._exit(1)
    os.close(alive)


def _broker_pidfd(keeper, germline, broker):
    """The pidfd of the broker (this process's parent) that the broker passed
    (`GERMLINE_BROKER_PIDFD`), which the first process polls: once it is readable the
    broker is gone, even by SIGKILL (at once if it was gone before this looked), and the
    first process kills the keeper (the namespace's init: everything in the germline's PID
    namespace dies with it) and the germline. Without one there is nothing to watch the
    broker by, and the germline does not run."""
    if broker is None:
        for pid in (keeper, germline):
            os.kill(pid, signal.SIGKILL)
        os._exit(1)
    return broker


def _immortal_refcount():
    """The reference count that makes an object immortal in this interpreter, or None
    where there is none this shim knows how to set: CPython 3.12 and 3.13 (PEP 683) with
    the GIL, in a release build on a 64-bit little-endian machine, where an object's
    count is its first word and `_Py_IMMORTAL_REFCNT` is 2**32 - 1."""
    import sysconfig

    if sys.implementation.name != "cpython" or sys.version_info[:2] not in ((3, 12), (3, 13)):
        return None
    if sysconfig.get_config_var("Py_GIL_DISABLED") or hasattr(sys, "gettotalrefcount"):
        return None  # free-threaded or debug builds lay the object header out otherwise
    if sys.byteorder != "little" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    return 0xFFFFFFFF


def _immortalize_heap():
    """Makes every object the germline holds immortal, so that a copy which uses one never
    writes its reference count.

    CPython writes an object's reference count each time a reference to it is taken or
    dropped, so a forked copy that merely runs the SDK's request path writes into the
    pages of every object it touches, and the kernel copies each page on that first
    write: on the noop release about 1,600 copy-on-write faults per copy before its first
    answer. An immortal object's count is never written (PEP 683), so those pages stay
    shared with the germline. Objects are reached from everything the collector tracks,
    then from each one's referents (strings, numbers, code, untracked tuples). They are
    never freed: that is what the germline does with them anyway (they are frozen next
    and live as long as it does), and a copy only keeps an object it drops for the rest
    of its one call. Where the interpreter has no immortal count (before 3.12) this does
    nothing. It changes no page any copy shares writably: each copy still gets its own
    copy of any page it writes."""
    value = _immortal_refcount()
    if value is None:
        return 0
    import gc

    objs = gc.get_objects()
    todo = list(objs)
    seen = {id(objs), id(todo)}
    seen.add(id(seen))
    count = ctypes.c_ssize_t
    get_referents = gc.get_referents
    n = 0
    while todo:
        o = todo.pop()
        i = id(o)
        if i in seen:
            continue
        seen.add(i)
        count.from_address(i).value = value
        n += 1
        todo.extend(get_referents(o))
    return n


def germline_main(release_dir):
    if os.environ.get("GERMLINE_PID_NAMESPACE") == "1":
        _enter_pid_namespace()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    # copy_source = "spawn": nothing of the release runs here, not even the SDK it may
    # vendor (preloading one from elsewhere would shadow it); each copy imports it all.
    server = None
    if os.environ.get("GERMLINE_COPY_SOURCE") != "spawn":
        server = _build_server(release_dir)
        _preload(server)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctid = _tid_field()
    # Everything the germline made stays out of the copies' collections: a full collection
    # writes into every tracked object, a copy-on-write fault for each page they occupy.
    import gc

    gc.collect()
    if os.environ.get("GERMLINE_IMMORTAL_HEAP") != "0":
        _immortalize_heap()
    gc.freeze()
    # The control channel is signals: SIGUSR1 (blocked, waited for) asks for one fork;
    # the germline stops itself when ready and after each fork, and the broker reads the
    # outcome from /proc. No descriptor is held across a fork (G2): stdio would be open
    # file descriptions shared with every copy, so each copy opens its own /dev/null.
    wake = {signal.SIGUSR1}
    # SIGUSR2 (the broker's "your channel is ready" to a copy) is blocked from before the
    # fork, so a copy cannot miss it.
    signal.pthread_sigmask(signal.SIG_BLOCK, wake | {signal.SIGUSR2})
    _close_stdio()
    me = os.getpid()
    os.kill(me, signal.SIGSTOP)
    while True:
        signal.sigwait(wake)
        pid = _clone(libc, ctid)
        if pid < 0 and os.environ.get("GERMLINE_KEEP_STDERR") == "1":
            print("germline: clone failed: errno %d" % ctypes.get_errno(), file=sys.stderr)
        if pid == 0:
            code = 0
            try:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, wake)
                # The germline ignores SIGCHLD so its copies are reaped unseen; the copy
                # gets the disposition an unprotected server has, so `subprocess` can
                # collect its own children's exit statuses (they stay inside the copy).
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                if os.environ.get("GERMLINE_SHARED_CONTROL") == "1":
                    os.close(CONTROL_FD)  # only a "mechanism off" test hands one over
                _own_stdio()
                _run_copy(server, release_dir)
            except BaseException:
                code = 1
                _report_stderr()
            finally:
                os._exit(code)
        os.kill(me, signal.SIGSTOP)


def serve_main(release_dir):
    server = _build_server(release_dir)
    _run_server(server)


def main():
    mode, release_dir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if mode == "germline":
        # The event loop, queues and thread pools keep real time: the twin clock is for
        # what release code observes, not for scheduling (a frozen or counted monotonic
        # clock would turn every timeout into a spin or a stall).
        import asyncio.base_events
        import concurrent.futures  # noqa: F401
        import queue  # noqa: F401

        _mono = time.monotonic
        asyncio.base_events.BaseEventLoop.time = lambda self: _mono()
        _patch_time()
        _install_datetime_clock()
        _patch_random()
        germline_main(release_dir)
    elif mode == "serve":
        serve_main(release_dir)
    else:
        raise SystemExit("usage: germline_host.py germline|serve RELEASE_DIR")


if __name__ == "__main__":
    main()
