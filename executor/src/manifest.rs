//! The release manifest (`germline.toml`, signed with the release): what the release
//! declares about itself. Parsed once into typed form; anything unknown is an error so a
//! typo cannot silently widen what a tool may do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use germline_model::HostName;
use serde::Deserialize;

use crate::ExecutorError;

/// The manifest's file name at the root of a release directory.
pub const MANIFEST_FILE: &str = "germline.toml";

/// The variable that hands the deployment's item placeholder values (a JSON object) to
/// the tool host, which fills them into the start-up arguments it reads from the manifest.
pub const ITEMS_VAR: &str = "GERMLINE_STARTUP_ITEMS";

/// A parsed release manifest.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// Release name.
    pub name: String,
    /// Release version.
    pub version: String,
    /// How the tool host builds the server.
    pub entry: Entry,
    /// Directories (relative to the release root) put on `sys.path`.
    pub python_path: Vec<PathBuf>,
    /// Release-wide determinism declaration.
    pub deterministic: bool,
    /// Per-tool declarations.
    pub tools: BTreeMap<String, ToolDecl>,
    /// Environment the germline starts with (`[release] env`; the deployer's policy wins).
    pub env: BTreeMap<String, String>,
    /// How copies are made (`[release] copy_source`; the policy may ask for `spawn` too).
    pub copy_source: CopySourceKind,
    /// Absolute paths the server writes besides `TMPDIR` (`[release] scratch`: a cache or
    /// log directory): each is private scratch to the germline while it imports and to each
    /// copy after ([`crate::confine::Confinement::scratch_paths`]).
    pub scratch: Vec<PathBuf>,
    /// Host programs, files and directories the server runs or reads at call time beyond
    /// its interpreter's own (`[release] system_paths`): a program by name (`git`, found on
    /// the germline's `PATH`) or an absolute path (a data directory). Bound read-only into the
    /// germline's root, and in a resident root locked in memory with the libraries they load
    /// ([`crate::resident`]); see [`Manifest::system_paths_on_host`].
    pub system_paths: Vec<String>,
}

/// How the copies of a release are made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CopySourceKind {
    /// Forked from a germline that imported the release once, data-free (the default).
    #[default]
    Fork,
    /// Forked from a germline that never imports the release: each copy imports it
    /// itself, after its ids check and before it is given any item. For releases that
    /// start threads at import (G1 refuses their germline, as a fork keeps one thread).
    /// Release code then never runs in the germline; every copy pays the import.
    Spawn,
}

impl CopySourceKind {
    /// The stricter of two requests: `spawn` if either asks for it (it is never weaker
    /// than forking from an imported germline, only slower).
    pub fn either(self, other: CopySourceKind) -> CopySourceKind {
        if self == CopySourceKind::Spawn || other == CopySourceKind::Spawn {
            CopySourceKind::Spawn
        } else {
            CopySourceKind::Fork
        }
    }
}

/// How the server object is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `module:callable` returning the server (built once, in the germline), called with
    /// `args` (a JSON array: official servers' factories take their start-up options).
    Factory {
        /// `module:callable`.
        callable: String,
        /// Positional arguments.
        args: Vec<serde_json::Value>,
    },
    /// `module:callable`, an async function that builds and serves the server itself
    /// (`main(db_path)` of mcp-server-sqlite): the module is imported in the germline, the
    /// function runs in each copy on the copy's stdio, paying its set-up per copy.
    Main {
        /// `module:callable`.
        callable: String,
        /// Positional arguments.
        args: Vec<serde_json::Value>,
    },
    /// `module:callable`, a server's command-line entry point (what its console script
    /// runs: it parses `sys.argv`, builds the server and serves stdio itself, often with
    /// its own `asyncio.run`): the module is imported in the germline; in each copy
    /// `sys.argv` is the release name followed by `args`, and the callable runs as the
    /// copy's whole life.
    Cli {
        /// `module:callable`.
        callable: String,
        /// The command-line arguments (`--db-path /data/shop.db`).
        args: Vec<String>,
    },
    /// A module with a server attribute.
    Module {
        /// Module name.
        module: String,
        /// Attribute holding the server.
        attribute: String,
    },
}

/// What the manifest declares for one tool.
#[derive(Clone, Debug, Default)]
pub struct ToolDecl {
    /// Declared destination hosts.
    pub hosts: Vec<HostName>,
    /// An argument whose value (a URL or host name) names a further destination.
    pub host_argument: Option<String>,
    /// Paths the tool reads.
    pub read_paths: Vec<String>,
    /// Per-tool determinism declaration (falls back to the release's).
    pub deterministic: Option<bool>,
    /// Arguments of a call of this tool that every pooled copy makes while it is readied,
    /// before it holds anything (its answer is dropped): a server that fills a cache at its
    /// first call (a list of time zones, a parsed schema) has it filled before a call waits
    /// on it. The copy has no view and no network then.
    pub warm_up: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    release: RawRelease,
    #[serde(default)]
    tools: BTreeMap<String, RawTool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelease {
    name: String,
    version: String,
    runtime: String,
    factory: Option<String>,
    factory_args: Option<String>,
    main: Option<String>,
    main_args: Option<String>,
    module: Option<String>,
    attribute: Option<String>,
    cli: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    python_path: Vec<String>,
    #[serde(default)]
    deterministic: bool,
    #[serde(default)]
    copy_source: CopySourceKind,
    #[serde(default)]
    scratch: Vec<String>,
    #[serde(default)]
    system_paths: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    #[serde(default)]
    hosts: Vec<String>,
    host_argument: Option<String>,
    #[serde(default)]
    read_paths: Vec<String>,
    deterministic: Option<bool>,
    warm_up: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Manifest {
    /// Reads and validates `DIR/germline.toml`.
    pub fn load(release_dir: &Path) -> Result<Manifest, ExecutorError> {
        let path = release_dir.join(MANIFEST_FILE);
        let text =
            std::fs::read_to_string(&path).map_err(|e| ExecutorError::Manifest(format!("{}: {e}", path.display())))?;
        Self::parse(&text)
    }

    /// Parses manifest text.
    pub fn parse(text: &str) -> Result<Manifest, ExecutorError> {
        let raw: RawManifest = toml::from_str(text).map_err(|e| ExecutorError::Manifest(e.to_string()))?;
        let r = raw.release;
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        };
        if !name_ok(&r.name) {
            return Err(ExecutorError::Manifest(format!("release name {:?} must be [a-z0-9._-]+", r.name)));
        }
        if r.runtime != "python" {
            return Err(ExecutorError::Manifest(format!("runtime {:?} is not supported (only \"python\")", r.runtime)));
        }
        if !r.args.is_empty() && r.cli.is_none() {
            return Err(ExecutorError::Manifest("args go with cli".into()));
        }
        let entry = match (r.factory, r.main, r.module, r.cli) {
            (Some(f), None, None, None) => {
                Entry::Factory { args: json_args("factory_args", r.factory_args)?, callable: f }
            }
            (None, Some(f), None, None) => Entry::Main { args: json_args("main_args", r.main_args)?, callable: f },
            (None, None, Some(m), None) => {
                Entry::Module { module: m, attribute: r.attribute.unwrap_or_else(|| "server".into()) }
            }
            (None, None, None, Some(c)) => Entry::Cli { callable: c, args: r.args },
            (None, None, None, None) => {
                return Err(ExecutorError::Manifest("give factory, main, cli or module".into()))
            }
            _ => return Err(ExecutorError::Manifest("give only one of factory, main, cli or module".into())),
        };
        if let Entry::Factory { callable, .. } | Entry::Main { callable, .. } | Entry::Cli { callable, .. } = &entry {
            if !callable.contains(':') {
                return Err(ExecutorError::Manifest(format!("{callable:?} must be module:callable")));
            }
        }
        let mut python_path = Vec::new();
        for p in r.python_path {
            let pb = PathBuf::from(&p);
            if pb.is_absolute() || pb.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                return Err(ExecutorError::Manifest(format!("python_path {p:?} must stay inside the release")));
            }
            python_path.push(pb);
        }
        let mut scratch = Vec::new();
        for p in r.scratch {
            let pb = PathBuf::from(&p);
            if !pb.is_absolute() {
                return Err(ExecutorError::Manifest(format!(
                    "scratch {p:?} must be absolute: the release directory is the signed release and stays read-only"
                )));
            }
            scratch.push(pb);
        }
        let mut tools = BTreeMap::new();
        for (name, t) in raw.tools {
            let hosts = t
                .hosts
                .iter()
                .map(|h| HostName::new(h).map_err(|e| ExecutorError::Manifest(format!("tool {name}: {e}"))))
                .collect::<Result<Vec<_>, _>>()?;
            tools.insert(
                name,
                ToolDecl {
                    hosts,
                    host_argument: t.host_argument,
                    read_paths: t.read_paths,
                    deterministic: t.deterministic,
                    warm_up: t.warm_up,
                },
            );
        }
        for p in &r.system_paths {
            let pb = Path::new(p);
            let program = !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
            let plain = pb.is_absolute()
                && pb.components().nth(1).is_some()
                && pb
                    .components()
                    .all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
            let host_only = ["/etc", "/proc", "/sys", "/dev"].iter().any(|d| pb.starts_with(d));
            let allowed = (program && !p.starts_with('.')) || (plain && !host_only);
            if !allowed {
                return Err(ExecutorError::Manifest(format!(
                    "system path {p:?} must be a program name or an absolute path without `.` or `..`, outside /etc, \
                     /proc, /sys and /dev"
                )));
            }
        }
        let system_paths = r.system_paths;
        Ok(Manifest {
            name: r.name,
            version: r.version,
            entry,
            python_path,
            deterministic: r.deterministic,
            tools,
            env: r.env,
            copy_source: r.copy_source,
            scratch,
            system_paths,
        })
    }

    /// Where this host has the manifest's system paths: a program name is looked up on the
    /// germline's `PATH` (`/usr/local/bin`, `/usr/bin`, `/bin`). One this host lacks is left
    /// out, with a warning: the server then fails where it runs it, as it would unprotected.
    pub fn system_paths_on_host(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for p in &self.system_paths {
            let found = if p.starts_with('/') {
                Some(PathBuf::from(p)).filter(|p| p.exists())
            } else {
                ["/usr/local/bin", "/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(p)).find(|c| c.is_file())
            };
            match found {
                Some(f) => out.push(f),
                None => {
                    tracing::warn!("{} {}: system path {p:?} is not on this host; not bound", self.name, self.version)
                }
            }
        }
        out
    }

    /// Reads `DIR/germline.toml` and fills its item placeholders from the deployer's
    /// policy ([`Manifest::fill_items`]).
    pub fn load_for(release_dir: &Path, policy: &crate::policy::Policy) -> Result<Manifest, ExecutorError> {
        let mut m = Self::load(release_dir)?;
        m.fill_items(&policy.startup_items)?;
        Ok(m)
    }

    /// Replaces each item placeholder `{item:NAME}` in the start-up arguments (`args`,
    /// `factory_args`, `main_args`), the tools' `read_paths` and the `env` values with the
    /// deployment's path for NAME: the publisher's manifest names which argument is a
    /// database, the deployer's policy says which file it is. A placeholder the deployment
    /// leaves unfilled is an error. The tool host fills the same values from the
    /// environment ([`ITEMS_VAR`]).
    pub fn fill_items(&mut self, values: &BTreeMap<String, String>) -> Result<(), ExecutorError> {
        let fill = |s: &str| -> Result<String, ExecutorError> {
            let mut out = s.to_owned();
            for (k, v) in values {
                out = out.replace(&format!("{{item:{k}}}"), v);
            }
            match out.find("{item:") {
                Some(i) => Err(ExecutorError::Manifest(format!(
                    "the item placeholder {} has no value in the policy's [startup_items]",
                    &out[i..out[i..].find('}').map_or(out.len(), |j| i + j + 1)]
                ))),
                None => Ok(out),
            }
        };
        fn fill_json(
            v: &mut serde_json::Value,
            fill: &dyn Fn(&str) -> Result<String, ExecutorError>,
        ) -> Result<(), ExecutorError> {
            match v {
                serde_json::Value::String(s) => *s = fill(s)?,
                serde_json::Value::Array(a) => a.iter_mut().try_for_each(|x| fill_json(x, fill))?,
                serde_json::Value::Object(o) => o.values_mut().try_for_each(|x| fill_json(x, fill))?,
                _ => {}
            }
            Ok(())
        }
        match &mut self.entry {
            Entry::Cli { args, .. } => args.iter_mut().try_for_each(|a| fill(a).map(|f| *a = f))?,
            Entry::Factory { args, .. } | Entry::Main { args, .. } => {
                args.iter_mut().try_for_each(|a| fill_json(a, &fill))?
            }
            Entry::Module { .. } => {}
        }
        for t in self.tools.values_mut() {
            t.read_paths.iter_mut().try_for_each(|p| fill(p).map(|f| *p = f))?;
        }
        self.env.values_mut().try_for_each(|v| fill(v).map(|f| *v = f))?;
        Ok(())
    }

    /// The warm-up calls every pooled copy makes before it waits in the pool (tool name and
    /// arguments), in tool order ([`ToolDecl::warm_up`]).
    pub fn warm_up_calls(&self) -> Vec<(String, serde_json::Value)> {
        self.tools
            .iter()
            .filter_map(|(name, t)| t.warm_up.clone().map(|a| (name.clone(), serde_json::Value::Object(a))))
            .collect()
    }

    /// The declaration for `tool`; a tool the manifest does not declare has no
    /// destinations (it can still run; every egress is denied).
    pub fn tool(&self, tool: &str) -> ToolDecl {
        self.tools.get(tool).cloned().unwrap_or_default()
    }
}

/// Start-up arguments are a JSON array in a string (TOML has no null, and factories such
/// as mcp-server-git's take `None` for "no restriction").
fn json_args(what: &str, text: Option<String>) -> Result<Vec<serde_json::Value>, ExecutorError> {
    match text {
        None => Ok(Vec::new()),
        Some(t) => match serde_json::from_str(&t) {
            Ok(serde_json::Value::Array(a)) => Ok(a),
            _ => Err(ExecutorError::Manifest(format!("{what} must be a JSON array, got {t:?}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let m = Manifest::parse(
            r#"
            [release]
            name = "ocr"
            version = "1.0.0"
            runtime = "python"
            factory = "ocr_server:create_server"
            python_path = ["src"]
            [tools.scan]
            hosts = ["ocr.example"]
            read_paths = ["/data/**"]
            deterministic = true
            "#,
        )
        .unwrap();
        assert_eq!(m.tool("scan").hosts[0].as_str(), "ocr.example");
        assert_eq!(m.tool("other").hosts.len(), 0);
        let bad = |s: &str| Manifest::parse(s).unwrap_err().to_string();
        assert!(bad("[release]\nname='x'\nversion='1'\nruntime='node'\nmodule='m'").contains("runtime"));
        assert!(bad("[release]\nname='x'\nversion='1'\nruntime='python'\nfactory='m:f'\nfactory_args='{}'")
            .contains("JSON array"));
        assert!(bad("[release]\nname='x'\nversion='1'\nruntime='python'\nmain='m'").contains("module:callable"));
        let m =
            Manifest::parse("[release]\nname='x'\nversion='1'\nruntime='python'\nmain='m:main'\nmain_args='[\"/d\"]'")
                .unwrap();
        assert_eq!(m.entry, Entry::Main { callable: "m:main".into(), args: vec![serde_json::json!("/d")] });
        assert!(bad("[release]\nname='x'\nversion='1'\nruntime='python'\nmodule='m'\nsurprise=1").contains("surprise"));
        assert!(bad("[release]\nname='x'\nversion='1'\nruntime='python'\nmodule='m'\npython_path=['../x']")
            .contains("inside"));
        assert!(bad("[release]\nname='x'\nversion='1'\nruntime='python'\nmodule='m'\n[tools.t]\nhosts=['Evil:80']")
            .contains("host"));
    }

    #[test]
    fn item_placeholders_are_filled_from_the_deployment() {
        let text = "[release]\nname='x'\nversion='1'\nruntime='python'\ncli='m:main'\n\
                    args=['--db-path', '{item:db}', '--ro']\n[release.env]\nDB='{item:db}'\n\
                    [tools.q]\nread_paths=['{item:db}']\n";
        let mut m = Manifest::parse(text).unwrap();
        let values = BTreeMap::from([("db".to_owned(), "/srv/shop.db".to_owned())]);
        m.fill_items(&values).unwrap();
        assert_eq!(
            m.entry,
            Entry::Cli {
                callable: "m:main".into(),
                args: vec!["--db-path".into(), "/srv/shop.db".into(), "--ro".into()]
            }
        );
        assert_eq!(m.tool("q").read_paths, vec!["/srv/shop.db".to_owned()]);
        assert_eq!(m.env["DB"], "/srv/shop.db");
        let err = Manifest::parse(text).unwrap().fill_items(&BTreeMap::new()).unwrap_err().to_string();
        assert!(err.contains("{item:db}"), "{err}");
    }

    #[test]
    fn system_paths_are_program_names_or_plain_absolute_paths_outside_etc() {
        let with = |paths: &str| {
            Manifest::parse(&format!(
                "[release]\nname='x'\nversion='1'\nruntime='python'\nfactory='s:f'\nsystem_paths={paths}\n"
            ))
        };
        let m = with(r#"["sh", "/usr/share/pandoc", "no-such-program-here"]"#).unwrap();
        assert_eq!(
            m.system_paths_on_host(),
            vec![PathBuf::from("/usr/bin/sh"), PathBuf::from("/usr/share/pandoc")]
                .into_iter()
                .filter(|p| p.exists())
                .collect::<Vec<_>>()
        );
        for bad in [
            r#"["../x"]"#,
            r#"["/usr/../etc"]"#,
            r#"["/etc/shadow"]"#,
            r#"["/proc/1"]"#,
            r#"["bin/sh"]"#,
            r#"[".."]"#,
            r#"[""]"#,
        ] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains("must be a program name or an absolute path"), "{bad}: {e}");
        }
    }
}
