//! The service's configuration: a TOML file, then `GERMLINE_*` environment overrides,
//! then command-line flags. The one exception is the baseline (an unprotected runtime,
//! for evaluation): only a flag or the file selects it, never the environment. With none of them, `germline serve` runs on loopback with the
//! data directory of the CLI commands.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use germline_executor::runtime::RuntimeKind;
use serde::Deserialize;

/// Default listen address: loopback only, so a fresh machine exposes nothing.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8420";

/// `germline serve`.
#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// Configuration file (TOML) [env: GERMLINE_CONFIG].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on [env: GERMLINE_LISTEN; default 127.0.0.1:8420].
    #[arg(long)]
    pub listen: Option<String>,
    /// Data directory: ledger, release store, witnesses, API token [env: GERMLINE_DATA_DIR].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Ready copies kept per germline [env: GERMLINE_POOL; config `pool`; default: the
    /// policy's `[limits] pool`, else 2]; 0 forks the copies of each call as it comes.
    #[arg(long)]
    pub pool: Option<usize>,
    /// For evaluation only: run admitted releases under an unprotected baseline instead of
    /// germline (`nosplit`, `sig-pin`, `sig-ifc`, `confined-ifc`, `fresh-ifc`) [config
    /// `baseline`; never from the environment]. `/readyz` reports it.
    #[arg(long)]
    pub baseline: Option<RuntimeKind>,
}

/// The configuration file's shape; every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    store_dir: Option<PathBuf>,
    tokens_file: Option<PathBuf>,
    policy: Option<PathBuf>,
    policies: Option<std::collections::BTreeMap<String, PathBuf>>,
    baseline: Option<String>,
    body_limit_bytes: Option<usize>,
    admission_body_limit_bytes: Option<usize>,
    call_deadline_ms: Option<u64>,
    shutdown_grace_ms: Option<u64>,
    max_session_calls: Option<usize>,
    read_requires_token: Option<bool>,
    tuf_repo_urls: Option<Vec<String>>,
    dispatch_policy: Option<String>,
    fleet: Option<germline_fleet::FleetConfig>,
    pool: Option<usize>,
    trust: Option<super::trust::TrustFile>,
    mcp_allowed_hosts: Option<Vec<String>>,
    mcp_allowed_origins: Option<Vec<String>>,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Data directory (ledger under `ledger/`, witnesses under `witnesses/`).
    pub data_dir: PathBuf,
    /// Release store (default `<data_dir>/store`).
    pub store_dir: PathBuf,
    /// Bearer-token hashes (TOML `[[tokens]] name, sha256`); `None`: `<data_dir>/api-token`.
    pub tokens_file: Option<PathBuf>,
    /// The deployer's policy for calls; `None`: nothing labelled, the agent is the consumer.
    pub policy: Option<PathBuf>,
    /// Policies of particular releases, by release name (`[policies] NAME = "FILE"`);
    /// the others run under `policy`.
    pub policies: std::collections::BTreeMap<String, PathBuf>,
    /// The baseline releases run under instead of germline (evaluation only): set by
    /// `--baseline` or the file's `baseline`, never by the environment.
    pub baseline: Option<RuntimeKind>,
    /// Ready copies per germline, overriding the policy's `[limits] pool`.
    pub pool: Option<usize>,
    /// Largest request body, except admission uploads.
    pub body_limit_bytes: usize,
    /// Largest admission request body (a sigstore admission carries the archive).
    pub admission_body_limit_bytes: usize,
    /// How long a request waits for its call (queueing on the release included).
    pub call_deadline: Duration,
    /// How long shutdown waits for in-flight calls.
    pub shutdown_grace: Duration,
    /// Most calls in one scripted session.
    pub max_session_calls: usize,
    /// Whether read endpoints need a token too (mutating ones always do).
    pub read_requires_token: bool,
    /// URL prefixes a caller-supplied TUF repository may be fetched from (with
    /// `[trust] allow_caller_roots`); local repository directories are always allowed.
    /// Empty by default: the service fetches nothing it was not told to. Configured TUF
    /// anchors name their own repositories.
    pub tuf_repo_urls: Vec<String>,
    /// Which releases a formed call may run on (DESIGN §8): `exact_pin`,
    /// `release_wide_allow`, `release_wide_deny` or `call_specific` (default).
    pub dispatch_policy: germline_model::DispatchPolicy,
    /// The fleet (`[fleet]`, or the file `GERMLINE_FLEET_CONFIG` names): this host's log is
    /// always published as tiles; peers and witnesses only when configured.
    pub fleet: germline_fleet::FleetConfig,
    /// Trust anchors (`[trust]`): TUF roots per repository, Sigstore identities, cosign
    /// keys; whether callers may bring their own; which repositories are followed.
    pub trust: super::trust::Trust,
    /// `Host` names the MCP endpoints answer to besides the listen address (and
    /// `localhost` on loopback): a web page's DNS-rebinding request names its own host.
    pub mcp_allowed_hosts: Vec<String>,
    /// Browser `Origin`s allowed to call the MCP endpoints (none by default; a request
    /// without `Origin` is not a browser's).
    pub mcp_allowed_origins: Vec<String>,
}

impl ServiceConfig {
    /// The runtime releases run under: germline unless a baseline was configured.
    pub fn runtime(&self) -> RuntimeKind {
        self.baseline.unwrap_or(RuntimeKind::Germline)
    }

    /// Resolves file, environment (`env` looked up by name) and flags, in that order of
    /// increasing precedence.
    pub fn resolve(args: &ServeArgs, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<ServiceConfig> {
        let config_path = args.config.clone().or_else(|| env("GERMLINE_CONFIG").map(PathBuf::from));
        let file = match &config_path {
            Some(p) => parse_file(p)?,
            None => FileConfig::default(),
        };
        let listen = args
            .listen
            .clone()
            .or_else(|| env("GERMLINE_LISTEN"))
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen: SocketAddr = listen.parse().with_context(|| format!("listen address {listen:?} is not IP:PORT"))?;
        let data_dir = args
            .data_dir
            .clone()
            .or_else(|| env("GERMLINE_DATA_DIR").map(PathBuf::from))
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from("germline-data"));
        let store_dir =
            env("GERMLINE_STORE_DIR").map(PathBuf::from).or(file.store_dir).unwrap_or_else(|| data_dir.join("store"));
        let tokens_file = env("GERMLINE_TOKENS_FILE").map(PathBuf::from).or(file.tokens_file);
        let policy = env("GERMLINE_POLICY").map(PathBuf::from).or(file.policy);
        // A baseline runs releases unprotected: only an explicit flag or configuration
        // key selects one, so no inherited environment can turn the service into it.
        if env("GERMLINE_RUNTIME").is_some() {
            tracing::warn!("GERMLINE_RUNTIME is ignored by `germline serve`; a baseline needs --baseline");
        }
        let baseline = match args.baseline {
            Some(kind) => Some(kind),
            None => file.baseline.map(|r| r.parse::<RuntimeKind>().map_err(anyhow::Error::msg)).transpose()?,
        };
        if baseline == Some(RuntimeKind::Germline) {
            bail!("germline is not a baseline: leave --baseline (config `baseline`) unset to run germline");
        }
        let num = |name: &str, from_file: Option<u64>, default: u64| -> anyhow::Result<u64> {
            match env(name) {
                Some(v) => v.trim().parse::<u64>().with_context(|| format!("{name}={v:?} is not a number")),
                None => Ok(from_file.unwrap_or(default)),
            }
        };
        let body_limit_bytes = num("GERMLINE_BODY_LIMIT", file.body_limit_bytes.map(|v| v as u64), 1 << 20)?;
        let admission_body_limit_bytes =
            num("GERMLINE_ADMISSION_BODY_LIMIT", file.admission_body_limit_bytes.map(|v| v as u64), 64 << 20)?;
        let call_deadline_ms = num("GERMLINE_CALL_DEADLINE_MS", file.call_deadline_ms, 120_000)?;
        let shutdown_grace_ms = num("GERMLINE_SHUTDOWN_GRACE_MS", file.shutdown_grace_ms, 30_000)?;
        let max_session_calls = num("GERMLINE_MAX_SESSION_CALLS", file.max_session_calls.map(|v| v as u64), 256)?;
        let read_requires_token = match env("GERMLINE_READ_REQUIRES_TOKEN") {
            Some(v) => matches!(v.trim(), "1" | "true" | "yes"),
            None => file.read_requires_token.unwrap_or(false),
        };
        if body_limit_bytes == 0 || admission_body_limit_bytes == 0 || call_deadline_ms == 0 || max_session_calls == 0 {
            bail!("body limits, call deadline and session size must be positive");
        }
        let tuf_repo_urls = file.tuf_repo_urls.unwrap_or_default();
        for u in &tuf_repo_urls {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                bail!("tuf_repo_urls entry {u:?} is not an http(s) URL prefix");
            }
        }
        let dispatch_policy = match env("GERMLINE_DISPATCH_POLICY").or(file.dispatch_policy) {
            Some(p) => p.parse::<germline_model::DispatchPolicy>()?,
            None => germline_model::DispatchPolicy::default(),
        };
        let fleet = match env("GERMLINE_FLEET_CONFIG") {
            Some(p) => germline_fleet::FleetConfig::load(Path::new(&p))?,
            None => file.fleet.unwrap_or_default(),
        };
        fleet.validate()?;
        let pool = match args.pool {
            Some(n) => Some(n),
            None => match env("GERMLINE_POOL") {
                Some(v) => {
                    Some(v.trim().parse::<usize>().with_context(|| format!("GERMLINE_POOL={v:?} is not a number"))?)
                }
                None => file.pool,
            },
        };
        let policies = file.policies.unwrap_or_default();
        for name in policies.keys() {
            let ok = !name.is_empty()
                && name.len() <= 128
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
            if !ok {
                bail!("[policies]: {name:?} is not a release name ([a-z0-9._-]+)");
            }
        }
        let trust = super::trust::Trust::resolve(file.trust.unwrap_or_default())?;
        let lower = |v: Option<Vec<String>>| -> Vec<String> {
            v.unwrap_or_default().into_iter().map(|s| s.trim_end_matches('/').to_ascii_lowercase()).collect()
        };
        Ok(ServiceConfig {
            trust,
            mcp_allowed_hosts: lower(file.mcp_allowed_hosts),
            mcp_allowed_origins: lower(file.mcp_allowed_origins),
            pool,
            fleet,
            listen,
            data_dir,
            store_dir,
            tokens_file,
            policy,
            policies,
            baseline,
            body_limit_bytes: usize::try_from(body_limit_bytes).context("body limit")?,
            admission_body_limit_bytes: usize::try_from(admission_body_limit_bytes).context("admission body limit")?,
            call_deadline: Duration::from_millis(call_deadline_ms),
            shutdown_grace: Duration::from_millis(shutdown_grace_ms),
            max_session_calls: usize::try_from(max_session_calls).context("session size")?,
            read_requires_token,
            tuf_repo_urls,
            dispatch_policy,
        })
    }
}

fn parse_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_need_nothing() {
        let c = ServiceConfig::resolve(&ServeArgs::default(), |_| None).unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.store_dir, PathBuf::from("germline-data/store"));
        assert!(!c.read_requires_token && c.tokens_file.is_none());
    }

    #[test]
    fn flags_beat_environment_beat_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("serve.toml");
        std::fs::write(&file, "listen = \"127.0.0.1:1\"\ndata_dir = \"/f\"\ncall_deadline_ms = 5\n").unwrap();
        let env = |k: &str| match k {
            "GERMLINE_LISTEN" => Some("127.0.0.1:2".to_owned()),
            "GERMLINE_DATA_DIR" => Some("/e".to_owned()),
            _ => None,
        };
        let args = ServeArgs { config: Some(file.clone()), listen: Some("127.0.0.1:3".into()), ..ServeArgs::default() };
        let c = ServiceConfig::resolve(&args, env).unwrap();
        assert_eq!(c.listen.port(), 3);
        assert_eq!(c.data_dir, PathBuf::from("/e"));
        assert_eq!(c.call_deadline, Duration::from_millis(5));
        let args = ServeArgs { config: Some(file), ..ServeArgs::default() };
        assert_eq!(ServiceConfig::resolve(&args, |_| None).unwrap().listen.port(), 1);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("serve.toml");
        std::fs::write(&file, "lisen = \"x\"\n").unwrap();
        let args = ServeArgs { config: Some(file), ..ServeArgs::default() };
        assert!(ServiceConfig::resolve(&args, |_| None).is_err());
        let bad = |k: &str| (k == "GERMLINE_BODY_LIMIT").then(|| "lots".to_owned());
        assert!(ServiceConfig::resolve(&ServeArgs::default(), bad).is_err());
    }

    #[test]
    fn a_baseline_comes_only_from_a_flag_or_the_file() {
        let env = |k: &str| (k == "GERMLINE_RUNTIME").then(|| "sig-pin".to_owned());
        let c = ServiceConfig::resolve(&ServeArgs::default(), env).unwrap();
        assert_eq!((c.baseline, c.runtime()), (None, RuntimeKind::Germline), "the environment selects nothing");
        let args = ServeArgs { baseline: Some(RuntimeKind::SigPin), ..ServeArgs::default() };
        assert_eq!(ServiceConfig::resolve(&args, |_| None).unwrap().runtime(), RuntimeKind::SigPin);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("serve.toml");
        std::fs::write(&file, "baseline = \"nosplit\"\n").unwrap();
        let args = ServeArgs { config: Some(file.clone()), ..ServeArgs::default() };
        assert_eq!(ServiceConfig::resolve(&args, |_| None).unwrap().baseline, Some(RuntimeKind::NoSplit));
        std::fs::write(&file, "runtime = \"sig-pin\"\n").unwrap();
        assert!(ServiceConfig::resolve(&args, |_| None).is_err(), "the old `runtime` key is refused, not ignored");
        let args = ServeArgs { baseline: Some(RuntimeKind::Germline), ..ServeArgs::default() };
        assert!(ServiceConfig::resolve(&args, |_| None).is_err());
    }
}
