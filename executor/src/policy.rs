//! The deployer's policy: labels of items, clearances of destinations and consumers, and
//! test host overrides. Labels and clearances come from here, never from a release.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use germline_model::{Clearance, ConsumerName, HostName, Label, Tag};
use globset::{GlobBuilder, GlobMatcher};
use serde::Deserialize;

use crate::tls::DeploymentTls;
use crate::ExecutorError;

/// A parsed, validated policy.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Whose data this deployment holds (slots are keyed by user as well as horizon).
    pub user: String,
    path_rules: Vec<PathRule>,
    arg_rules: Vec<ArgRule>,
    destinations: BTreeMap<HostName, Clearance>,
    consumers: BTreeMap<ConsumerName, Clearance>,
    host_map: BTreeMap<HostName, SocketAddr>,
    /// Per-copy budgets.
    pub limits: Limits,
    /// How the germline's root is built (`[sandbox]`).
    pub sandbox: Sandbox,
    tls_extra_roots: Vec<PathBuf>,
    tls: Option<Arc<DeploymentTls>>,
    /// Test-only: label item paths as the strings they were given (no resolution), the
    /// mechanism-off twin of the canonical-name tests.
    raw_path_labels: bool,
    /// Environment for the release's germline (`[environment]`), over the manifest's.
    /// Every copy sees it, so it must hold nothing secret.
    pub environment: BTreeMap<String, String>,
    /// The deployment's values of the manifest's item placeholders (`[startup_items]`:
    /// `db = "/srv/data/shop.db"` fills `{item:db}` in `args`, `read_paths` and `env`).
    pub startup_items: BTreeMap<String, String>,
}

#[derive(Clone, Debug)]
struct PathRule {
    glob: String,
    matcher: GlobMatcher,
    root: PathBuf,
    label: Label,
}

#[derive(Clone, Debug)]
struct ArgRule {
    argument: String,
    tool: Option<String>,
    label: Label,
    names_path: bool,
}

/// Budgets for each copy.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Absolute deadline for a copy on the broker's clock.
    pub deadline: Duration,
    /// Memory per copy in bytes.
    pub memory_bytes: u64,
    /// Processes per copy.
    pub processes: u64,
    /// CPU seconds per copy process.
    pub cpu_seconds: u64,
    /// Largest MCP message or HTTP request/response the broker accepts, in bytes.
    pub max_message_bytes: usize,
    /// Refuse to start a germline where no cgroup holds copies to `memory_bytes` and
    /// `processes` (rather than run with per-process rlimits only, with a warning).
    pub require_limits: bool,
    /// Ready copies kept per germline ([`crate::pool`]); 0 makes copies per call.
    pub pool: usize,
    /// Germlines a release may run on at once ([`crate::lanes`]): calls to one release run
    /// side by side on up to this many, each with its own pool; 1 (the default) runs them
    /// one at a time. More than 1 lets one release time its own calls (SECURITY.md, "Calls
    /// to one release at the same time").
    pub lanes: usize,
    /// `spawn`: every copy imports the release itself (for releases whose import starts
    /// threads); `fork` (default) unless the manifest asks for `spawn`.
    pub copy_source: crate::manifest::CopySourceKind,
}

/// How the germline's root is built (`[sandbox]`).
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// Bind only what the interpreter and the release read, every page of it locked in
    /// memory by the broker before the germline starts ([`crate::resident`]), so no copy can
    /// change what another sees of the page cache or of the root's directories. Default:
    /// [`resident_root_default`], on wherever the broker can make one (SECURITY.md, "Resident
    /// root"); `false` binds the whole of `/usr` instead, where those channels are open.
    pub resident_root: bool,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox { resident_root: default_resident_root() }
    }
}

/// Whether germlines get a resident root unless the policy says ([`resident_root_default`]).
pub fn default_resident_root() -> bool {
    resident_root_default().0
}

/// Whether germlines get a resident root unless the policy says, and why:
/// `GERMLINE_RESIDENT_ROOT=1` or `0` decides; otherwise it is on wherever this process can
/// mount and lock one ([`crate::resident::lock_capacity`]: a broker running as root), and
/// off, with the reason, where it cannot. Off by default is never silent: the first time a
/// process resolves it so, it logs a warning naming the channels that stay open, and
/// `germline doctor` and `/readyz` report it. A policy that sets `resident_root = true`
/// where it cannot be made is refused at germline start, never run with the default root.
pub fn resident_root_default() -> (bool, String) {
    match std::env::var("GERMLINE_RESIDENT_ROOT").as_deref() {
        Ok("1") => return (true, "GERMLINE_RESIDENT_ROOT=1".into()),
        Ok("0") => return (false, "GERMLINE_RESIDENT_ROOT=0".into()),
        Ok(other) => {
            static BAD: std::sync::Once = std::sync::Once::new();
            BAD.call_once(|| tracing::warn!(value = other, "GERMLINE_RESIDENT_ROOT is neither 1 nor 0; ignored"));
        }
        Err(_) => {}
    }
    match crate::resident::lock_capacity(crate::resident::TYPICAL_ROOT_BYTES) {
        Ok(_) => (true, "this broker can mount and lock one".into()),
        Err(why) => {
            static WEAKER: std::sync::Once = std::sync::Once::new();
            WEAKER.call_once(|| {
                tracing::warn!(
                    "germlines get the default root, which binds all of /usr: page-cache residency and negative \
                     dentries stay channels between copies (SECURITY.md, \"Resident root\"). {why}. Run germline \
                     as root for a resident root, or set [sandbox] resident_root = false to choose the default root"
                )
            });
            (false, why)
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSandbox {
    resident_root: Option<bool>,
}

/// Most ready copies a germline may keep: each is a live process tree holding a lease of
/// the broker's 1024 copy ids and counting against the germline's process limit.
pub const MAX_POOL: usize = 32;

/// Most germlines one release may run on at once.
pub const MAX_LANES: usize = 16;

/// Ready copies per germline unless the policy (`[limits] pool`) or a command's `--pool`
/// says otherwise: `GERMLINE_POOL` if set (the test suite runs the security tests with it
/// at 0 and at the default), else 2.
pub fn default_pool() -> usize {
    std::env::var("GERMLINE_POOL").ok().and_then(|v| v.parse().ok()).unwrap_or(2)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: Duration::from_secs(30),
            memory_bytes: 1 << 30,
            processes: 128,
            cpu_seconds: 60,
            max_message_bytes: 8 << 20,
            require_limits: false,
            pool: default_pool(),
            lanes: 1,
            copy_source: crate::manifest::CopySourceKind::Fork,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default = "default_user")]
    user: String,
    tags: Vec<String>,
    #[serde(default)]
    items: Vec<RawItem>,
    #[serde(default)]
    destinations: BTreeMap<String, RawClearance>,
    #[serde(default)]
    consumers: BTreeMap<String, RawClearance>,
    #[serde(default)]
    hosts: BTreeMap<String, String>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    tls: RawTls,
    #[serde(default)]
    sandbox: RawSandbox,
    #[serde(default)]
    environment: BTreeMap<String, String>,
    #[serde(default)]
    startup_items: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTls {
    /// PEM files of extra roots the broker trusts for destinations (test CAs).
    #[serde(default)]
    extra_roots: Vec<PathBuf>,
}

fn default_user() -> String {
    "default".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawItem {
    path: Option<String>,
    argument: Option<String>,
    tool: Option<String>,
    #[serde(default)]
    label: Vec<String>,
    /// The argument's value is a path: the labelled files at or under it (labels from the
    /// path rules) become file items of the call.
    #[serde(default)]
    names_path: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClearance {
    clearance: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    deadline_ms: Option<u64>,
    memory_mb: Option<u64>,
    processes: Option<u64>,
    cpu_seconds: Option<u64>,
    max_message_bytes: Option<usize>,
    require_limits: Option<bool>,
    pool: Option<usize>,
    lanes: Option<usize>,
    copy_source: Option<crate::manifest::CopySourceKind>,
}

fn perr(s: impl Into<String>) -> ExecutorError {
    ExecutorError::Policy(s.into())
}

impl Policy {
    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Policy, ExecutorError> {
        let text = std::fs::read_to_string(path).map_err(|e| perr(format!("{}: {e}", path.display())))?;
        Self::parse(&text)
    }

    /// Parses and validates policy text.
    pub fn parse(text: &str) -> Result<Policy, ExecutorError> {
        let raw: RawPolicy = toml::from_str(text).map_err(|e| perr(e.to_string()))?;
        let known: BTreeSet<Tag> =
            raw.tags.iter().map(|t| Tag::new(t).map_err(|e| perr(e.to_string()))).collect::<Result<_, _>>()?;
        let tags = |names: &[String], what: &str| -> Result<BTreeSet<Tag>, ExecutorError> {
            names
                .iter()
                .map(|n| {
                    let t = Tag::new(n).map_err(|e| perr(format!("{what}: {e}")))?;
                    if known.contains(&t) {
                        Ok(t)
                    } else {
                        Err(perr(format!("{what}: unknown tag {n:?} (declare it in `tags`)")))
                    }
                })
                .collect()
        };
        let mut path_rules = Vec::new();
        let mut arg_rules = Vec::new();
        for (i, item) in raw.items.iter().enumerate() {
            let label = Label::from_tags(tags(&item.label, &format!("items[{i}]"))?);
            match (&item.path, &item.argument) {
                (Some(glob), None) => {
                    if item.tool.is_some() || item.names_path {
                        return Err(perr(format!("items[{i}]: `tool` goes with `argument`")));
                    }
                    path_rules.push(path_rule(glob, label)?);
                }
                (None, Some(arg)) => {
                    if item.names_path && !item.label.is_empty() {
                        return Err(perr(format!("items[{i}]: a path argument takes its label from the path rules")));
                    }
                    arg_rules.push(ArgRule {
                        argument: arg.clone(),
                        tool: item.tool.clone(),
                        label,
                        names_path: item.names_path,
                    })
                }
                _ => return Err(perr(format!("items[{i}]: give exactly one of `path` or `argument`"))),
            }
        }
        for (i, a) in path_rules.iter().enumerate() {
            for b in &path_rules[i + 1..] {
                let overlap = a.matcher.is_match(&b.glob) || b.matcher.is_match(&a.glob) || a.glob == b.glob;
                if overlap && a.label != b.label {
                    return Err(perr(format!(
                        "item globs {:?} {} and {:?} {} overlap with conflicting labels",
                        a.glob, a.label, b.glob, b.label
                    )));
                }
            }
        }
        let mut destinations = BTreeMap::new();
        for (h, c) in &raw.destinations {
            let host = HostName::new(h).map_err(|e| perr(format!("destinations: {e}")))?;
            destinations.insert(host, Clearance::from_tags(tags(&c.clearance, &format!("destination {h}"))?));
        }
        let mut consumers = BTreeMap::new();
        for (n, c) in &raw.consumers {
            let name = ConsumerName::new(n).map_err(|e| perr(format!("consumers: {e}")))?;
            consumers.insert(name, Clearance::from_tags(tags(&c.clearance, &format!("consumer {n}"))?));
        }
        let mut host_map = BTreeMap::new();
        for (h, addr) in &raw.hosts {
            let host = HostName::new(h).map_err(|e| perr(format!("hosts: {e}")))?;
            let sa: SocketAddr =
                addr.parse().map_err(|_| perr(format!("hosts: {h} -> {addr:?} is not an IP:port address")))?;
            host_map.insert(host, sa);
        }
        let d = Limits::default();
        let l = raw.limits;
        let limits = Limits {
            deadline: l.deadline_ms.map(Duration::from_millis).unwrap_or(d.deadline),
            memory_bytes: l.memory_mb.map(|m| m << 20).unwrap_or(d.memory_bytes),
            processes: l.processes.unwrap_or(d.processes),
            cpu_seconds: l.cpu_seconds.unwrap_or(d.cpu_seconds),
            max_message_bytes: l.max_message_bytes.unwrap_or(d.max_message_bytes),
            require_limits: l.require_limits.unwrap_or(d.require_limits),
            pool: l.pool.unwrap_or(d.pool),
            lanes: l.lanes.unwrap_or(d.lanes),
            copy_source: l.copy_source.unwrap_or(d.copy_source),
        };
        if limits.pool > MAX_POOL {
            return Err(perr(format!("limits: pool = {} is more than {MAX_POOL} copies per germline", limits.pool)));
        }
        if !(1..=MAX_LANES).contains(&limits.lanes) {
            return Err(perr(format!("limits: lanes = {} is not between 1 and {MAX_LANES} germlines", limits.lanes)));
        }
        if limits.deadline.is_zero() || limits.max_message_bytes < 1024 {
            return Err(perr("limits: deadline must be positive and max_message_bytes at least 1024"));
        }
        for r in &raw.tls.extra_roots {
            if !r.is_absolute() {
                return Err(perr(format!("tls.extra_roots: {} must be an absolute path", r.display())));
            }
        }
        Ok(Policy {
            user: raw.user,
            path_rules,
            arg_rules,
            destinations,
            consumers,
            host_map,
            limits,
            sandbox: Sandbox { resident_root: raw.sandbox.resident_root.unwrap_or_else(default_resident_root) },
            tls_extra_roots: raw.tls.extra_roots,
            tls: None,
            raw_path_labels: false,
            environment: raw.environment,
            startup_items: raw.startup_items,
        })
    }

    /// Opens the deployment CA in `ca_dir` with this policy's extra roots and attaches it,
    /// so the broker can relay HTTPS. Without it, every `CONNECT` is denied.
    pub fn open_tls(&mut self, ca_dir: &Path) -> Result<Arc<DeploymentTls>, ExecutorError> {
        let tls = Arc::new(DeploymentTls::open(ca_dir, &self.tls_extra_roots)?);
        self.tls = Some(tls.clone());
        Ok(tls)
    }

    /// The broker's TLS side, if [`Policy::open_tls`] attached one.
    pub fn tls(&self) -> Option<&Arc<DeploymentTls>> {
        self.tls.as_ref()
    }

    /// The file a path names, in canonical form: absolute, `..` and `.` resolved, duplicate
    /// separators removed, every symlink followed. Labels, plans and copies use this name,
    /// so a file carries the label of where it is, whatever string named it
    /// (`/data/finance/../hr/x` is the hr file `/data/hr/x`). Relative paths are refused:
    /// they would be resolved against a directory the policy knows nothing about.
    pub fn canonical_path(&self, path: &Path) -> Result<PathBuf, ExecutorError> {
        if !path.is_absolute() {
            return Err(ExecutorError::Call(format!("path {} must be absolute", path.display())));
        }
        if self.raw_path_labels {
            return Ok(path.to_path_buf());
        }
        std::fs::canonicalize(path).map_err(|e| ExecutorError::Call(format!("path {}: {e}", path.display())))
    }

    /// Test-only: label paths as given, without resolving them (the raw-string twin that
    /// shows what canonical names prevent). Never set outside tests.
    #[doc(hidden)]
    pub fn label_raw_paths_for_tests(mut self) -> Policy {
        self.raw_path_labels = true;
        self
    }

    /// Whether this policy resolves paths before labelling them (false only in the
    /// test-only raw twin).
    pub fn resolves_paths(&self) -> bool {
        !self.raw_path_labels
    }

    /// The label of a file item (a canonical path, see [`Policy::canonical_path`]), or an
    /// error if no rule (or conflicting rules) cover it.
    pub fn label_path(&self, path: &Path) -> Result<Label, ExecutorError> {
        let hits: Vec<&PathRule> = self.path_rules.iter().filter(|r| r.matches(path)).collect();
        match hits.as_slice() {
            [] => Err(ExecutorError::Call(format!("item {} has no label in the policy", path.display()))),
            [first, rest @ ..] => {
                if rest.iter().any(|r| r.label != first.label) {
                    return Err(ExecutorError::Call(format!("item {} matches conflicting labels", path.display())));
                }
                Ok(first.label.clone())
            }
        }
    }

    /// The label of argument `arg` of `tool`, if the policy labels it.
    pub fn label_argument(&self, tool: &str, arg: &str) -> Option<Label> {
        self.arg_rules
            .iter()
            .filter(|r| !r.names_path && r.argument == arg && r.tool.as_deref().is_none_or(|t| t == tool))
            .map(|r| r.label.clone())
            .reduce(|a, b| a.join(&b))
    }

    /// Whether argument `arg` of `tool` names a path whose labelled files are items of
    /// the call (a repository, a database file).
    pub fn is_path_argument(&self, tool: &str, arg: &str) -> bool {
        self.arg_rules.iter().any(|r| r.names_path && r.argument == arg && r.tool.as_deref().is_none_or(|t| t == tool))
    }

    /// Whether some path rule labels `path`.
    pub fn labels_path(&self, path: &Path) -> bool {
        self.path_rules.iter().any(|r| r.matches(path))
    }

    /// A destination's clearance; an unknown destination may see nothing labelled.
    pub fn destination_clearance(&self, host: &HostName) -> Clearance {
        self.destinations.get(host).cloned().unwrap_or_default()
    }

    /// A consumer's clearance; unknown consumers are an error (results would otherwise
    /// reach someone the deployer never named).
    pub fn consumer_clearance(&self, c: &ConsumerName) -> Result<Clearance, ExecutorError> {
        self.consumers.get(c).cloned().ok_or_else(|| ExecutorError::Call(format!("consumer {c} is not in the policy")))
    }

    /// Where the broker sends requests for `host` (tests map names to loopback).
    pub fn host_address(&self, host: &HostName) -> Option<SocketAddr> {
        self.host_map.get(host).copied()
    }

    /// Directories that may hold user data: the fixed prefixes of every path rule, with
    /// nested ones folded into their parents.
    pub fn data_roots(&self) -> Vec<PathBuf> {
        let mut roots: Vec<PathBuf> = self.path_rules.iter().map(|r| r.root.clone()).collect();
        roots.sort();
        roots.dedup();
        let all = roots.clone();
        roots.retain(|r| !all.iter().any(|o| o != r && r.starts_with(o)));
        roots
    }
}

fn path_rule(glob: &str, label: Label) -> Result<PathRule, ExecutorError> {
    if !glob.starts_with('/') {
        return Err(perr(format!("item path {glob:?} must be absolute")));
    }
    // `*` and `?` never cross a `/`: `/d/hr/*.pdf` is the PDFs in `/d/hr`, not below it.
    let matcher = GlobBuilder::new(glob)
        .literal_separator(true)
        .build()
        .map_err(|e| perr(format!("item path {glob:?}: {e}")))?
        .compile_matcher();
    let comps: Vec<&str> = glob.split('/').filter(|c| !c.is_empty()).collect();
    let mut root = PathBuf::from("/");
    let mut fixed = 0;
    for comp in &comps {
        let Some(name) = literal(comp) else { break };
        root.push(name);
        fixed += 1;
    }
    if root == Path::new("/") {
        return Err(perr(format!("item path {glob:?} needs a fixed directory prefix")));
    }
    // A rule naming one file: its root is the directory holding it.
    if fixed == comps.len() && !glob.ends_with('/') {
        root.pop();
    }
    if glob.split('/').any(|c| c == ".." || c == ".") || glob.contains("//") {
        return Err(perr(format!("item path {glob:?} must be in canonical form (no `.`, `..` or `//`)")));
    }
    Ok(PathRule { glob: glob.to_owned(), matcher, root, label })
}

/// The glob that matches `path` and nothing else: each glob metacharacter in it escaped
/// as a class of itself (`{` as `[{]`), which [`Policy::data_roots`] reads as the literal
/// it stands for.
pub fn literal_glob(path: &Path) -> String {
    globset::escape(&path.to_string_lossy())
}

/// Path component `comp` of a glob as the name it matches, with escaped metacharacters
/// ([`literal_glob`]) undone; `None` if it holds a wildcard, class or alternation.
fn literal(comp: &str) -> Option<String> {
    let c: Vec<char> = comp.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '[' if i + 2 < c.len() && c[i + 2] == ']' && "?*[]{}".contains(c[i + 1]) => {
                out.push(c[i + 1]);
                i += 3;
            }
            '*' | '?' | '[' | '{' => return None,
            ch => {
                out.push(ch);
                i += 1;
            }
        }
    }
    Some(out)
}

impl PathRule {
    /// Whether the rule covers `path` (canonical). A rule whose fixed prefix is itself a
    /// symlink on this host (`/data` → `/srv/data`) also covers the prefix's target, so the
    /// resolved name keeps the deployer's label.
    fn matches(&self, path: &Path) -> bool {
        if self.matcher.is_match(path) {
            return true;
        }
        match std::fs::canonicalize(&self.root) {
            Ok(real) if real != self.root => {
                path.strip_prefix(&real).map(|rest| self.matcher.is_match(self.root.join(rest))).unwrap_or(false)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = r#"
        tags = ["finance", "hr", "public"]
        [[items]]
        path = "/srv/data/finance/**"
        label = ["finance"]
        [[items]]
        path = "/srv/data/hr/*.pdf"
        label = ["hr"]
        [[items]]
        argument = "note"
        label = ["hr"]
        [destinations."ocr.example"]
        clearance = ["finance"]
        [consumers.agent]
        clearance = ["finance", "hr"]
        [hosts]
        "ocr.example" = "127.0.0.1:9999"
    "#;

    #[test]
    fn labels_and_clearances() {
        let p = Policy::parse(P).unwrap();
        let fin = Label::parse(["finance"]).unwrap();
        assert_eq!(p.label_path(Path::new("/srv/data/finance/a/b.pdf")).unwrap(), fin);
        assert!(p.label_path(Path::new("/srv/other")).is_err());
        assert_eq!(p.label_argument("any", "note"), Some(Label::parse(["hr"]).unwrap()));
        assert!(p.label_argument("any", "other").is_none());
        let q = Policy::parse("tags=['a']\n[[items]]\nargument='repo_path'\ntool='git_log'\nnames_path=true").unwrap();
        assert!(q.is_path_argument("git_log", "repo_path") && !q.is_path_argument("git_show", "repo_path"));
        assert!(q.label_argument("git_log", "repo_path").is_none());
        let ocr = HostName::new("ocr.example").unwrap();
        assert_eq!(p.destination_clearance(&ocr), Clearance::parse(["finance"]).unwrap());
        assert!(p.destination_clearance(&HostName::new("blog.example").unwrap()).is_empty());
        assert_eq!(p.host_address(&ocr).unwrap().port(), 9999);
        assert_eq!(p.data_roots(), vec![PathBuf::from("/srv/data/finance"), PathBuf::from("/srv/data/hr")]);
    }

    #[test]
    fn rejects_bad_policies() {
        let bad = |s: &str| Policy::parse(s).unwrap_err().to_string();
        assert!(bad("tags=['a']\n[[items]]\npath='/d/**'\nlabel=['b']").contains("unknown tag"));
        assert!(bad("tags=['a','b']\n[[items]]\npath='/d/**'\nlabel=['a']\n[[items]]\npath='/d/x/**'\nlabel=['b']")
            .contains("conflicting"));
        assert!(bad("tags=['a']\n[hosts]\n'x.example'='nowhere'").contains("IP:port"));
        assert!(bad("tags=['a']\n[destinations.'Bad Host']\nclearance=[]").contains("host"));
        assert!(bad("tags=['a']\n[[items]]\npath='**/x'\nlabel=['a']").contains("absolute"));
        assert!(bad("tags=['a']\n[tls]\nextra_roots=['ca.pem']").contains("absolute"));
        assert!(Policy::parse("tags=['a']\n[tls]\nextra_roots=['/etc/test-ca.pem']").is_ok());
        for glob in ["/d/../x/**", "/d/./x/**", "/d//x/**"] {
            assert!(bad(&format!("tags=['a']\n[[items]]\npath='{glob}'\nlabel=['a']")).contains("canonical"), "{glob}");
        }
    }

    #[test]
    fn a_directory_named_with_glob_characters_is_a_rule_and_a_data_root_when_escaped() {
        for dir in ["/d/Q3 {draft}x{", "/d/q[3", "/d/a]b}c", "/d/what?*"] {
            let glob = format!("{}/**", literal_glob(Path::new(dir)));
            let p = Policy::parse(&format!("tags=['a']\n[[items]]\npath={glob:?}\nlabel=['a']"))
                .unwrap_or_else(|e| panic!("{dir}: {e}"));
            assert_eq!(p.data_roots(), [PathBuf::from(dir)], "{glob}");
            assert!(p.labels_path(&Path::new(dir).join("payslip.txt")), "{glob}");
            assert!(!p.labels_path(Path::new("/d/other/payslip.txt")), "{glob}");
        }
        // Unescaped, the same characters are glob syntax: the root ends before them.
        let p = Policy::parse("tags=['a']\n[[items]]\npath='/d/q*/x/**'\nlabel=['a']").unwrap();
        assert_eq!(p.data_roots(), [PathBuf::from("/d")]);
        let p = Policy::parse("tags=['a']\n[[items]]\npath='/d/hr/pay.pdf'\nlabel=['a']").unwrap();
        assert_eq!(p.data_roots(), [PathBuf::from("/d/hr")], "a rule naming one file has its directory as root");
    }

    #[test]
    fn globs_match_with_literal_separators() {
        let p = Policy::parse(P).unwrap();
        assert!(p.labels_path(Path::new("/srv/data/hr/a.pdf")));
        assert!(!p.labels_path(Path::new("/srv/data/hr/sub/a.pdf")), "`*` must not cross a `/`");
        assert!(p.labels_path(Path::new("/srv/data/finance/a/b/c")));
    }

    #[test]
    fn paths_are_labelled_by_the_file_they_name() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().canonicalize().unwrap();
        for l in ["finance", "hr"] {
            std::fs::create_dir_all(base.join(l)).unwrap();
        }
        std::fs::write(base.join("hr/payslip.txt"), "x").unwrap();
        std::os::unix::fs::symlink(base.join("hr"), base.join("finance/link")).unwrap();
        let text = format!(
            "tags=['finance','hr']\n[[items]]\npath='{b}/finance/**'\nlabel=['finance']\n[[items]]\npath='{b}/hr/**'\nlabel=['hr']",
            b = base.display()
        );
        let p = Policy::parse(&text).unwrap();
        let hr = Label::parse(["hr"]).unwrap();
        let fin = Label::parse(["finance"]).unwrap();
        let b = base.display();
        for given in [
            format!("{b}/finance/../hr/payslip.txt"),
            format!("{b}/finance//..//hr/payslip.txt"),
            format!("{b}/finance/./../hr/./payslip.txt"),
            format!("{b}/finance/link/payslip.txt"),
        ] {
            let c = p.canonical_path(Path::new(&given)).unwrap();
            assert_eq!(c, base.join("hr/payslip.txt"), "{given}");
            assert_eq!(p.label_path(&c).unwrap(), hr, "{given}");
            // The raw-string twin labels the same string finance: what resolution prevents.
            let raw = p.clone().label_raw_paths_for_tests();
            let r = raw.canonical_path(Path::new(&given)).unwrap();
            assert_eq!(raw.label_path(&r).unwrap(), fin, "{given}");
        }
        assert!(p.canonical_path(Path::new("finance/x")).unwrap_err().to_string().contains("absolute"));
    }
}
