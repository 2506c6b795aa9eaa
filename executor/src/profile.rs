//! Effect profiles for successor capture (DESIGN §8).
//!
//! A profile is a reviewed file (`executor/profiles/FAMILY.toml`) naming one source region
//! of a release family, the structure it accepts, the arguments it supports and the
//! effects it models. [`summarize`] checks a release's source against it and registers a
//! [`Summary`] (or rejects registration, so the release is never captured); [`Summary::effect`]
//! applies a summary to one formed call and gives its modeled effect, or `None`
//! (`UNKNOWN`: no certificate).
//!
//! The analysis runs in CPython's own `ast` module (`profiles/pyast_profile.py`, run by
//! the project's interpreter with `-I`): it parses exactly the grammar of the interpreter
//! that runs the release, and needs no parser crate that could lag the language.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use germline_model::Sha256Digest;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use crate::germline::PythonRuntime;
use crate::manifest::Manifest;
use crate::ExecutorError;

const ANALYZER: &str = include_str!("../profiles/pyast_profile.py");

/// The reviewed profiles shipped with germline, by family (release name).
const BUILTIN: [(&str, &str); 2] = [
    ("mcp-server-git", include_str!("../profiles/mcp-server-git.toml")),
    ("repohost", include_str!("../profiles/repohost.toml")),
];

/// A reviewed profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The release family (release name) it covers.
    pub family: String,
    /// The tool whose calls it models.
    pub tool: String,
    /// Which analysis checks the region (`dash_guarded_sink`, `bool_default_flow`).
    pub analysis: String,
    /// The source file, relative to the release root or one of its `python_path` dirs.
    pub source: String,
    /// The function whose body is the region.
    pub function: String,
    /// The argument whose flow is modeled.
    pub argument: String,
    /// The dotted callee of the effect's sink.
    pub sink: String,
    /// Reviewed callee inventory of the region (`dash_guarded_sink`).
    #[serde(default)]
    pub callees: Vec<String>,
}

impl Profile {
    /// Parses a profile file's text.
    pub fn parse(text: &str) -> Result<Profile, ExecutorError> {
        toml::from_str(text).map_err(|e| ExecutorError::Profile(e.to_string()))
    }

    /// The shipped profile of `family`, if there is one.
    pub fn builtin(family: &str) -> Option<Profile> {
        BUILTIN.iter().find(|(f, _)| *f == family).and_then(|(_, t)| Profile::parse(t).ok())
    }

    /// The digest of the profile itself (part of every summary's provenance).
    pub fn digest(&self) -> Sha256Digest {
        Sha256Digest::of(self)
    }
}

/// A registered summary: what the profile established about one release's source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The profile it was made under.
    pub profile: Profile,
    /// SHA-256 of the analysed source file.
    pub source_sha256: Sha256Digest,
    /// The analysis's facts (e.g. `dash_rejection_before_sink`, `default`).
    pub facts: Value,
}

/// What [`summarize`] concluded.
#[derive(Clone, Debug, PartialEq)]
pub enum Registration {
    /// The source fits the profile's accepted structure.
    Registered(Box<Summary>),
    /// It does not: no summary, no certificate for any call.
    Rejected(String),
}

impl Summary {
    /// The summary's digest (what a captured successor records).
    pub fn digest(&self) -> Sha256Digest {
        Sha256Digest::of(self)
    }

    /// The modeled effects of calling `tool` with `arguments` on the summarised release,
    /// or `None` (UNKNOWN) outside the profile's supported arguments.
    pub fn effect(&self, tool: &str, arguments: &Map<String, Value>) -> Option<Vec<String>> {
        if tool != self.profile.tool {
            return None;
        }
        let arg = arguments.get(&self.profile.argument);
        let one = |e: &str| Some(vec![e.to_owned()]);
        match self.profile.analysis.as_str() {
            "dash_guarded_sink" => {
                let target = arg?.as_str()?;
                let guarded = self.facts.get("dash_rejection_before_sink")?.as_bool()?;
                if !target.starts_with('-') {
                    one("read")
                } else if guarded {
                    one("reject")
                } else if target.starts_with("--output=") {
                    one("fs_write")
                } else {
                    None
                }
            }
            "bool_default_flow" => {
                let private = match arg {
                    None => self.facts.get("default")?.as_bool()?,
                    Some(v) => v.as_bool()?,
                };
                one(if private { "egress:private" } else { "egress:public" })
            }
            _ => None,
        }
    }
}

/// Where `profile.source` lies in `release_dir`: the root, then each `python_path` dir.
fn source_path(release_dir: &Path, profile: &Profile) -> Option<PathBuf> {
    let mut dirs = vec![release_dir.to_path_buf()];
    if let Ok(m) = Manifest::load(release_dir) {
        dirs.extend(m.python_path.iter().map(|p| release_dir.join(p)));
    }
    dirs.into_iter().map(|d| d.join(&profile.source)).find(|p| p.is_file())
}

/// Checks `source` (a Python file) against `profile`.
pub fn summarize_source(profile: &Profile, source: &Path, python: &Path) -> Result<Registration, ExecutorError> {
    let bytes = std::fs::read(source).map_err(ExecutorError::io(format!("reading {}", source.display())))?;
    let req = serde_json::json!({
        "analysis": profile.analysis,
        "source": source,
        "function": profile.function,
        "argument": profile.argument,
        "sink": profile.sink,
        "callees": profile.callees,
    });
    let mut child = Command::new(python)
        .args(["-I", "-c", ANALYZER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(ExecutorError::io(format!("running {}", python.display())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(req.to_string().as_bytes()).map_err(ExecutorError::io("writing the profile request"))?;
    }
    let out = child.wait_with_output().map_err(ExecutorError::io("waiting for the profile analysis"))?;
    let answer: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        ExecutorError::Profile(format!("analysis output: {e}; stderr: {}", String::from_utf8_lossy(&out.stderr)))
    })?;
    match answer.get("status").and_then(Value::as_str) {
        Some("registered") => Ok(Registration::Registered(Box::new(Summary {
            profile: profile.clone(),
            source_sha256: Sha256Digest(Sha256::digest(&bytes).into()),
            facts: answer.get("facts").cloned().unwrap_or(Value::Null),
        }))),
        _ => Ok(Registration::Rejected(
            answer.get("reason").and_then(Value::as_str).unwrap_or("analysis failed").to_owned(),
        )),
    }
}

/// Checks the release in `release_dir` against `profile`.
pub fn summarize(profile: &Profile, release_dir: &Path, python: &PythonRuntime) -> Result<Registration, ExecutorError> {
    match source_path(release_dir, profile) {
        Some(src) => summarize_source(profile, &src, &python.python),
        None => Ok(Registration::Rejected(format!("{} not found in the release", profile.source))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(analysis: &str, facts: Value) -> Summary {
        let family = if analysis == "dash_guarded_sink" { "mcp-server-git" } else { "repohost" };
        Summary {
            profile: Profile::builtin(family).unwrap_or_else(|| panic!("profile {family}")),
            source_sha256: Sha256Digest([0; 32]),
            facts,
        }
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn git_effects_follow_the_guard_fact() {
        let fixed = summary("dash_guarded_sink", json!({"dash_rejection_before_sink": true}));
        let old = summary("dash_guarded_sink", json!({"dash_rejection_before_sink": false}));
        let normal = args(json!({"repo_path": "/r", "target": "main"}));
        let dash = args(json!({"repo_path": "/r", "target": "--output=/tmp/x"}));
        let other = args(json!({"repo_path": "/r", "target": "--stat"}));
        assert_eq!(fixed.effect("git_diff", &normal), Some(vec!["read".into()]));
        assert_eq!(old.effect("git_diff", &normal), Some(vec!["read".into()]));
        assert_eq!(fixed.effect("git_diff", &dash), Some(vec!["reject".into()]));
        assert_eq!(old.effect("git_diff", &dash), Some(vec!["fs_write".into()]));
        assert_eq!(old.effect("git_diff", &other), None, "unpatched other options are UNKNOWN");
        assert_eq!(fixed.effect("git_log", &normal), None, "other tools are UNKNOWN");
        assert_eq!(old.effect("git_diff", &args(json!({"target": 3}))), None);
    }

    #[test]
    fn repohost_effects_follow_the_default() {
        let private = summary("bool_default_flow", json!({"default": true}));
        let public = summary("bool_default_flow", json!({"default": false}));
        let omitted = args(json!({"name": "x"}));
        assert_eq!(private.effect("create_repository", &omitted), Some(vec!["egress:private".into()]));
        assert_eq!(public.effect("create_repository", &omitted), Some(vec!["egress:public".into()]));
        let explicit = args(json!({"name": "x", "private": true}));
        assert_eq!(public.effect("create_repository", &explicit), Some(vec!["egress:private".into()]));
        assert_eq!(public.effect("create_repository", &args(json!({"private": "yes"}))), None);
    }

    #[test]
    fn shipped_profiles_parse() {
        for (f, _) in BUILTIN {
            assert_eq!(Profile::builtin(f).map(|p| p.family), Some(f.to_owned()));
        }
    }
}
