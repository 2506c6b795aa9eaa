# Fork-window scaffolding shared by the residency attacks (certlink, negdentry, memcgevict,
# pageload), prepended to each by `redteam_residency`. The release wraps the shim's
# `_clone`, so its `_window()` runs in the germline right before every fork of a copy; the
# copy forked then finds its own window last in `WIN`, and every later copy inherits what
# the germline measured in it. Each release defines `_window`, `WIN` and `ERR`; they are
# looked up when a fork happens, after the whole release has been read.


def _install():
    shim = sys.modules.get("__main__")
    clone = getattr(shim, "_clone", None)
    if clone is None:
        return "no shim"

    def windowed_clone(libc, ctid):
        try:
            _window()
        except Exception as e:  # keep forking whatever happens
            ERR.append(repr(e))
        return clone(libc, ctid)

    shim._clone = windowed_clone
    return "installed"


INSTALLED = _install()


def _me():
    return len(WIN) - 1  # this copy's own fork window (appended just before its fork)
