# Sibling mechanisms tried against the full germline: each is a kernel object or counter
# two copies alive at once (or a copy and the germline) could both reach. `probe` runs in a
# copy and reports, per mechanism, "ok" or the error the sandbox answered with.
# Runs after the test prelude (os, sys, json, FastMCP).
import ctypes
import errno
import fcntl
import mmap
import socket

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _sys(nr, *args):
    r = _libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r < 0:
        e = ctypes.get_errno()
        return errno.errorcode.get(e, str(e))
    if nr not in (39, 102):  # getpid/getuid return no descriptor
        try:
            os.close(r)
        except OSError:
            pass
    return "ok"


def _try(fn):
    try:
        r = fn()
        return "ok" if r is None else r
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
    except Exception as e:  # noqa: BLE001
        return type(e).__name__


def _sock(*a):
    s = socket.socket(*a)
    s.close()


def _hugetlb():
    m = mmap.mmap(-1, 2 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000)  # MAP_HUGETLB
    m[0] = 1
    m.close()


def _pipe_size():
    r, w = os.pipe()
    try:
        return "ok %d" % fcntl.fcntl(r, 1032)  # F_GETPIPE_SZ
    finally:
        os.close(r)
        os.close(w)


def _write(path):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)


def _connect(port):
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect(("127.0.0.1", port))
    finally:
        s.close()


def _setrlimit_up():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1))


def _clone_namespace(flags):
    """clone with namespace flags (the call germline itself forks copies with): the child
    leaves at once; "ok" if the kernel made the namespace."""
    pid = _libc.syscall(ctypes.c_long(56), ctypes.c_long(flags | 17), None, None, None, None)  # | SIGCHLD
    if pid == 0:
        os._exit(0)
    if pid < 0:
        e = ctypes.get_errno()
        return errno.errorcode.get(e, str(e))
    os.waitpid(pid, 0)
    return "ok"


def _ids():
    return "%s %s" % (os.getresuid(), os.getresgid())


def create_server():
    m = FastMCP("probe")

    @m.tool()
    def probe() -> str:
        r = {
            "proc": _try(lambda: str(len(os.listdir("/proc")))),
            "sys": _try(lambda: str(len(os.listdir("/sys")))),
            "dev": _try(lambda: ",".join(sorted(os.listdir("/dev")))),
            "unix socket": _try(lambda: _sock(socket.AF_UNIX, socket.SOCK_STREAM)),
            "udp socket": _try(lambda: _sock(socket.AF_INET, socket.SOCK_DGRAM)),
            "netlink socket": _try(lambda: _sock(16, socket.SOCK_RAW, 0)),
            "packet socket": _try(lambda: _sock(17, socket.SOCK_RAW, 0)),
            "vsock socket": _try(lambda: _sock(40, socket.SOCK_STREAM, 0)),
            "scm_rights": _try(lambda: socket.send_fds(socket.socketpair()[0], [b"x"], [0])),
            "connect other port": _try(lambda: _connect(22)),
            "unshare user": _sys(272, 0x10000000),
            "clone user namespace": _try(lambda: _clone_namespace(0x10000000)),
            "clone user+net namespaces": _try(lambda: _clone_namespace(0x10000000 | 0x40000000)),
            "setresuid other": _sys(117, 1, 1, 1),
            "ids": _try(_ids),
            "setns": _sys(308, 0, 0),
            "keyctl": _sys(250, 0, 0),
            "add_key": _sys(248, 0, 0, 0, 0, 0),
            "timer_create": _sys(222, 1, 0, 0),
            "timerfd_create": _sys(283, 1, 0),
            "inotify_init1": _sys(294, 0),
            "fanotify_init": _sys(300, 0, 0),
            "mq_open": _sys(240, 0, 0, 0, 0),
            "shmget": _sys(29, 0, 4096, 0o1600),
            "semget": _sys(64, 0, 1, 0o1600),
            "msgget": _sys(68, 0, 0o1600),
            "io_uring_setup": _sys(425, 1, 0),
            "userfaultfd": _sys(323, 0),
            "perf_event_open": _sys(298, 0, 0, -1, -1, 0),
            "bpf": _sys(321, 0, 0, 0),
            "ptrace": _sys(101, 16, 1, 0, 0),
            "process_vm_readv": _sys(310, 1, 0, 0, 0, 0, 0),
            "kcmp": _sys(312, 1, 1, 0, 0, 0),
            "setpriority": _sys(141, 0, 0, 5),
            "sched_setaffinity": _sys(203, 0, 8, 0),
            "sched_setscheduler": _sys(144, 0, 0, 0),
            "ioprio_set": _sys(251, 1, 0, 0),
            "sysinfo": _sys(99, 0),
            "sethostname": _sys(170, 0, 0),
            "splice": _sys(275, 0, 0, 0, 0, 0, 0),
            "vmsplice": _sys(278, 0, 0, 0, 0),
            "tee": _sys(276, 0, 0, 0, 0),
            "mincore": _sys(27, 0, 0, 0),
            "sendmsg": _sys(46, 0, 0, 0),
            "rt_sigqueueinfo": _sys(129, 1, 34, 0),
            "kill SIGRTMIN": _sys(62, 0, 34),
            "madvise MERGEABLE": _sys(28, 0, 4096, 12),
            "prctl PR_SET_TIMERSLACK": _sys(157, 29, 1, 0, 0, 0),
            "prctl PR_SET_VMA": _sys(157, 0x53564D41, 0, 0, 0, 0),
            "fcntl F_SETPIPE_SZ": _try(lambda: fcntl.fcntl(os.pipe()[0], 1031, 1 << 20)),
            "MAP_HUGETLB": _try(_hugetlb),
            "write /dev/urandom": _try(lambda: _write("/dev/urandom")),
            "write /dev/null": _try(lambda: _write("/dev/null")),
            "raise RLIMIT_NOFILE": _try(_setrlimit_up),
            "pipe": _try(_pipe_size),
            "epoll (per-user watches)": _sys(291, 0),
        }
        return json.dumps(r, sort_keys=True)

    return m
