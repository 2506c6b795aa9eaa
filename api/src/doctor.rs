//! `germline doctor`: what this host lets germline enforce, and what it does not, with the
//! fix for each. Every line is a probe of the kernel or the interpreter, not a guess from
//! versions. Exits non-zero when something germline cannot run without is missing.

use std::path::Path;
use std::process::{Command, Stdio};

use clap::Args;
use germline_executor::cgroup::{host_support, HostSupport};
use germline_executor::germline::PythonRuntime;
use germline_executor::host;
use serde_json::json;

/// `germline doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// How a check came out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Enforced as designed.
    Ok,
    /// Runs, with a weaker mechanism (named in the line).
    Weaker,
    /// germline cannot run here.
    Missing,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Weaker => "weaker",
            Status::Missing => "MISSING",
        }
    }
}

struct Check {
    name: &'static str,
    status: Status,
    detail: String,
    fix: String,
}

/// Runs every check; prints them; fails if one is missing.
pub fn run(args: &DoctorArgs) -> anyhow::Result<()> {
    let checks = vec![user_namespaces(), landlock(), seccomp(), cgroups(), host_root(), resident_root(), interpreter()];
    if args.json {
        let rows: Vec<_> = checks
            .iter()
            .map(|c| json!({"check": c.name, "status": c.status.word(), "detail": c.detail, "fix": c.fix}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for c in &checks {
            println!("{:<18} {:<8} {}", c.name, c.status.word(), c.detail);
            if !c.fix.is_empty() {
                println!("{:<18} {:<8} fix: {}", "", "", c.fix);
            }
        }
    }
    let missing: Vec<&str> = checks.iter().filter(|c| c.status == Status::Missing).map(|c| c.name).collect();
    anyhow::ensure!(missing.is_empty(), "germline cannot run here: {}", missing.join(", "));
    Ok(())
}

fn user_namespaces() -> Check {
    let ok = host::can_make_namespaces();
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    if ok {
        Check {
            name: "namespaces",
            status: Status::Ok,
            detail: format!("user, PID and network namespaces can be made (max_user_namespaces {})", max.trim()),
            fix: String::new(),
        }
    } else {
        Check {
            name: "namespaces",
            status: Status::Missing,
            detail: "this process cannot make user, PID and network namespaces: no copy can be isolated".into(),
            fix: "sysctl -w user.max_user_namespaces=15000 (and kernel.unprivileged_userns_clone=1 where it exists), \
                  or run germline as root"
                .into(),
        }
    }
}

fn landlock() -> Check {
    match host::landlock_abi() {
        abi if abi >= 1 => Check {
            name: "landlock",
            status: Status::Ok,
            detail: format!(
                "ABI {abi}: the germline's files are limited to its root{}",
                if abi >= 4 { "; TCP connect limited to the broker's ports" } else { "" }
            ),
            fix: if abi < 4 {
                "a kernel with Landlock ABI 4 (6.7+) also limits TCP ports".into()
            } else {
                String::new()
            },
        },
        _ => Check {
            name: "landlock",
            status: Status::Weaker,
            detail: "Landlock is not available: the germline's file access rests on its minimal root and mount \
                     namespace alone"
                .into(),
            fix: "boot with lsm=...,landlock (CONFIG_SECURITY_LANDLOCK=y)".into(),
        },
    }
}

fn seccomp() -> Check {
    if host::seccomp_filters() {
        Check {
            name: "seccomp",
            status: Status::Ok,
            detail: "filters available: the germline and its copies run under the syscall allowlist".into(),
            fix: String::new(),
        }
    } else {
        Check {
            name: "seccomp",
            status: Status::Missing,
            detail: "seccomp filters are not available: no syscall allowlist for the germline and its copies".into(),
            fix: "a kernel with CONFIG_SECCOMP_FILTER=y".into(),
        }
    }
}

fn cgroups() -> Check {
    let support = host_support();
    let status = match support {
        HostSupport::V1 | HostSupport::V2 { limits: true } => Status::Ok,
        HostSupport::V2 { limits: false } | HostSupport::None => Status::Weaker,
    };
    Check {
        name: "cgroups",
        status,
        detail: support.describe().to_owned(),
        fix: match support {
            HostSupport::V2 { limits: false } => {
                "delegate the memory and pids controllers to germline's cgroup (cgroup.subtree_control), or run \
                 under a systemd unit with Delegate=yes"
                    .into()
            }
            HostSupport::None => {
                "run as root, or in a cgroup v2 subtree germline can write (systemd-run --user -p Delegate=yes); \
                 set [limits] require_limits = true to refuse to run without"
                    .into()
            }
            _ => String::new(),
        },
    }
}

fn host_root() -> Check {
    if host::host_root() {
        Check {
            name: "copy ids",
            status: Status::Ok,
            detail: "host root: every copy runs as host ids of its own, and the germline's pid counter is reset \
                     before each fork"
                .into(),
            fix: String::new(),
        }
    } else {
        Check {
            name: "copy ids",
            status: Status::Weaker,
            detail: "not host root: copies share one host uid, so kernel counters kept per user (pipe buffers) are \
                     shared between them (SECURITY.md)"
                .into(),
            fix: "run as root, or switch the pipe quota off (sysctl -w fs.pipe-user-pages-soft=0)".into(),
        }
    }
}

/// Whether germlines get a resident root here by default (SECURITY.md, "Resident root").
fn resident_root() -> Check {
    use germline_executor::policy::resident_root_default;
    use germline_executor::resident::{lock_capacity, TYPICAL_ROOT_BYTES};
    let (on, why) = resident_root_default();
    let capacity = lock_capacity(TYPICAL_ROOT_BYTES);
    match (on, capacity) {
        (true, Ok(how)) => Check {
            name: "resident root",
            status: Status::Ok,
            detail: format!("on by default ({why}): {how}"),
            fix: String::new(),
        },
        (true, Err(why_not)) => Check {
            name: "resident root",
            status: Status::Missing,
            detail: format!("on by default ({why}), but {why_not}: every germline start is refused"),
            fix: "run germline as root, or unset GERMLINE_RESIDENT_ROOT".into(),
        },
        (false, capacity) => Check {
            name: "resident root",
            status: Status::Weaker,
            detail: format!(
                "off by default ({why}): germlines bind all of /usr, where page-cache residency and negative dentries \
                 are channels between copies (SECURITY.md)"
            ),
            fix: match capacity {
                Ok(_) => "unset GERMLINE_RESIDENT_ROOT (it is 0 here)".into(),
                Err(_) => {
                    "run germline as root (the tree needs CAP_SYS_ADMIN; the lock CAP_IPC_LOCK or a hard memlock \
                           limit, ulimit -l / LimitMEMLOCK=, above 512 MiB)"
                        .into()
                }
            },
        },
    }
}

/// How to get an interpreter with the MCP SDK.
pub const SDK_FIX: &str =
    "bash scripts/setup.sh (makes .venv with the SDK), or set GERMLINE_PYTHON to an interpreter that has the mcp package";

/// The version of the MCP SDK `python` imports (`Ok(Err)`: the last line of its error), by
/// the interpreter's own path (a venv's `python` is a symlink whose target lacks the SDK).
pub fn sdk_version(python: &Path) -> std::io::Result<Result<String, String>> {
    let out = Command::new(python)
        .args(["-I", "-c", "import importlib.metadata as m, mcp; print(m.version('mcp'))"])
        .stdin(Stdio::null())
        .output()?;
    Ok(if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default().to_owned())
    })
}

fn interpreter() -> Check {
    let home = germline_host::home();
    let rt = match PythonRuntime::discover(&home) {
        Ok(rt) => rt,
        Err(e) => {
            return Check {
                name: "interpreter",
                status: Status::Missing,
                detail: format!("no Python interpreter: {e}"),
                fix: "bash scripts/setup.sh (makes .venv), or set GERMLINE_PYTHON to an interpreter with the mcp \
                      package"
                    .into(),
            }
        }
    };
    let sdk = sdk_version(&rt.python);
    let shim = rt.shim_dir.join("germline_host.py");
    match sdk {
        Ok(Ok(version)) => Check {
            name: "interpreter",
            status: if Path::new(&shim).is_file() { Status::Ok } else { Status::Missing },
            detail: format!("{}; MCP SDK {version}; tool host in {}", rt.describe(), rt.shim_dir.display()),
            fix: String::new(),
        },
        Ok(Err(why)) => Check {
            name: "interpreter",
            status: Status::Missing,
            detail: format!("{} cannot import the MCP SDK: {why}", rt.python.display()),
            fix: SDK_FIX.into(),
        },
        Err(e) => Check {
            name: "interpreter",
            status: Status::Missing,
            detail: format!("{} does not run: {e}", rt.python.display()),
            fix: "set GERMLINE_PYTHON to a working interpreter".into(),
        },
    }
}
