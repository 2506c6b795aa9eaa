//! The reviewed effect profiles (DESIGN §8) against official releases and semantic
//! mutations. mcp-server-git: the AST body of `git_diff` must pass `target` directly to
//! one `repo.git.diff`; a `target.startswith("-")` rejection before that sink turns a
//! `--output=PATH` target from a file write into a rejection. Upstream added it in
//! 2025.12.18: the official wheels (vendored by `scripts/setup.sh`) must classify as
//! that history says, and every mutation must keep the dangerous state or be rejected.

use std::path::{Path, PathBuf};
use std::process::Command;

use germline_executor::profile::{summarize, summarize_source, Profile, Registration, Summary};
use germline_tests::fcd::{
    git_release, real_servers, repohost_release, repohost_release_with, GIT_BEFORE_FIX, GIT_FIXED,
};
use germline_tests::world::python;
use serde_json::{json, Map, Value};

const OFFICIAL: [(&str, bool); 8] = [
    ("2025.1.14", false),
    ("2025.7.1", false),
    ("2025.9.25", false),
    ("2025.11.25", false),
    ("2025.12.18", true),
    ("2026.1.14", true),
    ("2026.6.4", true),
    ("2026.10.19", true),
];

fn interpreter(home: &Path) -> PathBuf {
    python(home).python
}

/// `mcp_server_git/server.py` of official wheel `version`, written under `dir`.
fn official_source(dir: &Path, py: &Path, version: &str) -> PathBuf {
    let wheel = real_servers().join("git-wheels").join(format!("mcp_server_git-{version}-py3-none-any.whl"));
    assert!(wheel.is_file(), "{} is missing: run scripts/setup.sh", wheel.display());
    let out = dir.join(format!("server-{version}.py"));
    let ok = Command::new(py)
        .args([
            "-I",
            "-c",
            "import sys,zipfile;open(sys.argv[2],'wb').write(zipfile.ZipFile(sys.argv[1]).read('mcp_server_git/server.py'))",
        ])
        .arg(&wheel)
        .arg(&out)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "extracting {}", wheel.display());
    out
}

fn git_profile() -> Profile {
    Profile::builtin("mcp-server-git").expect("shipped git profile")
}

fn registered(r: Registration) -> Summary {
    match r {
        Registration::Registered(s) => *s,
        Registration::Rejected(why) => panic!("registration rejected: {why}"),
    }
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

fn dash_call() -> Map<String, Value> {
    args(json!({"repo_path": "/r", "target": "--output=/tmp/canary"}))
}

#[test]
fn official_git_releases_classify_as_the_upstream_history_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let py = interpreter(&dir.path().join("home"));
    let mut matched = 0;
    for (version, fixed) in OFFICIAL {
        let src = official_source(dir.path(), &py, version);
        let s = registered(summarize_source(&git_profile(), &src, &py).expect("analysis"));
        let guard = s.facts["dash_rejection_before_sink"].as_bool();
        let effect = s.effect("git_diff", &dash_call());
        let normal = s.effect("git_diff", &args(json!({"repo_path": "/r", "target": "main"})));
        eprintln!("mcp-server-git {version}: guard {guard:?}, dash target -> {effect:?}, normal -> {normal:?}");
        assert_eq!(guard, Some(fixed), "{version}");
        assert_eq!(effect, Some(vec![if fixed { "reject" } else { "fs_write" }.to_owned()]), "{version}");
        assert_eq!(normal, Some(vec!["read".to_owned()]), "{version}");
        matched += 1;
    }
    eprintln!("stock {matched}/{}", OFFICIAL.len());
    // The release directories the dispatch tests run are found through python_path.
    for (version, fixed) in [(GIT_BEFORE_FIX, false), (GIT_FIXED, true)] {
        let rel = git_release(dir.path(), version).expect("vendored release: run scripts/setup.sh");
        let s = registered(summarize(&git_profile(), &rel, &python(&dir.path().join("home"))).expect("analysis"));
        assert_eq!(s.facts["dash_rejection_before_sink"], json!(fixed), "{version}");
    }
}

/// A mutation of the last unguarded (or the first guarded) official `git_diff`.
fn mutate(dir: &Path, py: &Path, base: &str, name: &str, f: impl Fn(&str) -> String) -> Registration {
    let text = std::fs::read_to_string(official_source(dir, py, base)).expect("source");
    let mutated = f(&text);
    assert_ne!(mutated, text, "mutation {name} changed nothing");
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, mutated).expect("write");
    summarize_source(&git_profile(), &path, py).expect("analysis")
}

const UNGUARDED: &str = "    return repo.git.diff(f\"--unified={context_lines}\", target)\n";
const GUARD: &str = "    if target.startswith(\"-\"):\n        raise BadName(f\"Invalid target: '{target}' - cannot start with '-'\")\n";

#[test]
fn semantic_mutations_keep_the_dangerous_state_or_are_rejected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let py = interpreter(&dir.path().join("home"));
    let dangerous = |r: Registration| {
        let s = registered(r);
        assert_eq!(s.facts["dash_rejection_before_sink"], json!(false));
        assert_eq!(s.effect("git_diff", &dash_call()), Some(vec!["fs_write".to_owned()]));
    };
    let rejected = |r: Registration, why: &str| match r {
        Registration::Rejected(reason) => assert!(reason.contains(why), "{reason}"),
        Registration::Registered(s) => panic!("registered: {:?}", s.facts),
    };
    // A comment that mentions a guard creates no guard fact.
    dangerous(mutate(dir.path(), &py, GIT_BEFORE_FIX, "comment-spoof", |t| {
        t.replacen(UNGUARDED, &format!("    # if target.startswith(\"-\"): raise BadName(target)\n{UNGUARDED}"), 1)
    }));
    // So does a guard in a string.
    dangerous(mutate(dir.path(), &py, GIT_BEFORE_FIX, "string-spoof", |t| {
        t.replacen(UNGUARDED, &format!("    \"if target.startswith('-'): raise BadName(target)\"\n{UNGUARDED}"), 1)
    }));
    // A guard after the sink does not precede it.
    dangerous(mutate(dir.path(), &py, GIT_BEFORE_FIX, "guard-after-sink", |t| {
        t.replacen(
            UNGUARDED,
            &format!("    out = repo.git.diff(f\"--unified={{context_lines}}\", target)\n{GUARD}    return out\n"),
            1,
        )
    }));
    // A guard that only logs does not reject.
    dangerous(mutate(dir.path(), &py, GIT_BEFORE_FIX, "non-rejecting-guard", |t| {
        t.replacen(UNGUARDED, &format!("    if target.startswith(\"-\"):\n        pass\n{UNGUARDED}"), 1)
    }));
    // One direct diff sink is required.
    rejected(
        mutate(dir.path(), &py, GIT_FIXED, "missing-sink", |t| t.replacen(UNGUARDED, "    return \"\"\n", 1)),
        "found 0",
    );
    rejected(
        mutate(dir.path(), &py, GIT_BEFORE_FIX, "two-sinks", |t| {
            t.replacen(UNGUARDED, &format!("    repo.git.diff(target)\n{UNGUARDED}"), 1)
        }),
        "found 2",
    );
    // A rewritten target is no direct flow, and an unreviewed callee is outside the inventory.
    rejected(
        mutate(dir.path(), &py, GIT_BEFORE_FIX, "rewritten-target", |t| {
            t.replacen(UNGUARDED, &format!("    target = target.strip()\n{UNGUARDED}"), 1)
        }),
        "reassigned",
    );
    rejected(
        mutate(dir.path(), &py, GIT_FIXED, "unreviewed-callee", |t| {
            t.replacen(UNGUARDED, &format!("    repo.git.execute(['git', 'fetch'])\n{UNGUARDED}"), 1)
        }),
        "inventory",
    );
    // The real guard, moved into place by hand, is recognised.
    let s = registered(mutate(dir.path(), &py, GIT_BEFORE_FIX, "guard-added", |t| {
        t.replacen(UNGUARDED, &format!("{GUARD}{UNGUARDED}"), 1)
    }));
    assert_eq!(s.effect("git_diff", &dash_call()), Some(vec!["reject".to_owned()]));
}

#[test]
fn repohost_profile_reads_the_omitted_default_and_rejects_unparsed_shapes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = python(&dir.path().join("home"));
    let profile = Profile::builtin("repohost").expect("profile");
    let omitted = args(json!({"name": "x"}));
    for (v, private) in [("1.0.0", true), ("1.1.0", false)] {
        let s = registered(summarize(&profile, &repohost_release(dir.path(), v, private), &home).expect("analysis"));
        let want = if private { "egress:private" } else { "egress:public" };
        assert_eq!(s.effect("create_repository", &omitted), Some(vec![want.to_owned()]), "{v}");
    }
    let body = |b: &str| {
        format!(
            "def create_repository(name: str, private: bool | None = None) -> str:\n{b}\n\ndef create_server():\n    m = FastMCP('repohost')\n    m.tool()(create_repository)\n    return m\n"
        )
    };
    let post =
        "    post('http://repos.example/repos', json.dumps({'name': name, 'private': visibility}))\n    return 'ok'";
    // The default set in a second place, a comment claiming one, or no parser at all.
    let cases = [
        (
            "2.0.0",
            format!("    visibility = True if private is None else private\n    visibility = False\n{post}"),
            "more than once",
        ),
        (
            "2.1.0",
            format!(
                "    # visibility = True if private is None else private\n    visibility = private or False\n{post}"
            ),
            "parser",
        ),
        ("2.2.0", "    return 'no request'".to_owned(), "parser"),
    ];
    for (v, b, why) in cases {
        match summarize(&profile, &repohost_release_with(dir.path(), v, &body(&b)), &home).expect("analysis") {
            Registration::Rejected(reason) => assert!(reason.contains(why), "{v}: {reason}"),
            Registration::Registered(s) => panic!("{v} registered: {:?}", s.facts),
        }
    }
}
