//! Issue 16, point 3: `tools/list` for a server that opens its data while it starts.
//! mcp-server-sqlite builds its server around the database named on its command line, so a
//! data-free copy cannot list its tools; germline lists them from a copy that holds the
//! paths the tools declare, labelled like that data. The Python SDK's client (which lists
//! tools before it validates results) then sees `germline wrap` as the bare server, and a
//! consumer not cleared for the database gets no list.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

fn python() -> PathBuf {
    std::env::var_os("GERMLINE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

/// mcp-server-sqlite as vendored by `scripts/setup.sh`, with its manifest and `{DB}`.
fn sqlite_release(dir: &Path, db: &Path) -> PathBuf {
    let real = std::env::var_os("GERMLINE_REAL_SERVERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/germline/real-servers"));
    let vendor = real.join("sqlite/vendor");
    assert!(real.join("sqlite/.complete").is_file(), "{} is missing: run scripts/setup.sh", vendor.display());
    let rel = dir.join("sqlite");
    std::fs::create_dir_all(&rel).expect("release dir");
    let ok = Command::new("cp").arg("-rl").arg(&vendor).arg(&rel).status().is_ok_and(|s| s.success())
        || Command::new("cp").arg("-r").arg(&vendor).arg(&rel).status().is_ok_and(|s| s.success());
    assert!(ok, "copying {}", vendor.display());
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/real_servers/sqlite.toml"))
            .expect("manifest");
    std::fs::write(rel.join("germline.toml"), manifest.replace("{DB}", &db.to_string_lossy())).expect("manifest");
    rel
}

fn make_db(db: &Path) {
    let ok = Command::new(python())
        .arg("-c")
        .arg(
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\n\
             c.execute('create table customers(id integer primary key, name text)')\n\
             c.executemany('insert into customers(name) values (?)', [('c%d' % i,) for i in range(5)])\n\
             c.commit()",
        )
        .arg(db)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "creating the database");
}

/// What the SDK client saw (`tests/front/mcp_calls_check.py`).
fn client(calls: &Value, cmd: &[&std::ffi::OsStr], home: &Path, labels_off: bool) -> Value {
    let mut c = Command::new(python());
    if labels_off {
        c.env("GERMLINE_TEST_FRONT_LABELS_OFF", "1");
    }
    let out = c
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/front/mcp_calls_check.py"))
        .arg(calls.to_string())
        .args(cmd)
        .env("GERMLINE_HOME", home)
        .env("GERMLINE_DATA_DIR", home.join("ledger"))
        .env("GERMLINE_PYTHON", python())
        .stderr(Stdio::inherit())
        .output()
        .expect("running the SDK client");
    if !out.status.success() {
        return json!({"failed": String::from_utf8_lossy(&out.stdout)});
    }
    serde_json::from_slice(&out.stdout).expect("client summary")
}

#[test]
fn the_sdk_client_sees_wrapped_sqlite_as_the_bare_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let db = data.join("shop.db");
    make_db(&db);
    let rel = sqlite_release(dir.path(), &db);
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "tags = [\"projx\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"projx\"]\n\
             [consumers.agent]\nclearance = [\"projx\"]\n[consumers.public]\nclearance = []\n",
            data.display()
        ),
    )
    .expect("policy");
    let calls = json!([
        ["list_tables", {}],
        ["describe_table", {"table_name": "customers"}],
        ["read_query", {"query": "SELECT name FROM customers WHERE id <= 3"}],
        ["read_query", {"query": "SELECT * FROM nowhere"}],
    ]);
    let bare_code = format!(
        "import sys; sys.path.insert(0, {:?}); sys.argv[1:] = ['--db-path', {:?}]; from mcp_server_sqlite import main; main()",
        rel.join("vendor"),
        db
    );
    let py = python();
    let mut bare = client(&calls, &[py.as_os_str(), "-c".as_ref(), bare_code.as_ref()], &home, false);
    let germline = std::ffi::OsStr::new(env!("CARGO_BIN_EXE_germline"));
    let wrap = |consumer: &str, labels_off: bool| {
        let args: Vec<&std::ffi::OsStr> = vec![
            germline,
            "wrap".as_ref(),
            "--policy".as_ref(),
            policy.as_os_str(),
            "--consumer".as_ref(),
            consumer.as_ref(),
            "--".as_ref(),
            rel.as_os_str(),
        ];
        client(&calls, &args, &home, labels_off)
    };
    let mut wrapped = wrap("agent", false);
    eprintln!("bare: {bare}\nwrapped: {wrapped}");
    let labels = wrapped.as_object_mut().and_then(|o| o.remove("labels")).unwrap_or_default();
    assert!(labels.as_array().is_some_and(|a| a.iter().all(|l| l == &json!(["projx"]))), "labels: {labels}");
    let tools_label = wrapped.as_object_mut().and_then(|o| o.remove("tools_label")).unwrap_or_default();
    assert_eq!(tools_label, json!(["projx"]), "the list carries the database's label");
    bare.as_object_mut().map(|o| (o.remove("labels"), o.remove("tools_label")));
    assert!(bare["tools"].as_array().is_some_and(|t| t.len() >= 3), "the bare server's tools: {bare}");
    assert_eq!(bare, wrapped, "germline wrap differs from the bare server");

    // A consumer cleared for nothing gets no list (the SDK client fails at tools/list);
    // with the front's label check off, it would.
    let public_off = wrap("public", true);
    assert_eq!(public_off["tools"], bare["tools"], "labels off: the uncleared consumer gets the list");
    let public = wrap("public", false);
    eprintln!("public: {public}");
    assert!(public.get("failed").is_some(), "an uncleared consumer listed the tools: {public}");
}

/// A corpus server laid out as `tests/real_servers/NAME.toml` describes, `{DB}` replaced.
fn corpus_release(dir: &Path, name: &str, db: &str) -> PathBuf {
    let real = std::env::var_os("GERMLINE_REAL_SERVERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/germline/real-servers"));
    let vendor = real.join(name).join("vendor");
    assert!(real.join(name).join(".complete").is_file(), "{} is missing: run scripts/setup.sh", vendor.display());
    let rel = dir.join(name);
    std::fs::create_dir_all(&rel).expect("release dir");
    let ok = Command::new("cp").arg("-rl").arg(&vendor).arg(&rel).status().is_ok_and(|s| s.success())
        || Command::new("cp").arg("-r").arg(&vendor).arg(&rel).status().is_ok_and(|s| s.success());
    assert!(ok, "copying {}", vendor.display());
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/real_servers/{name}.toml")),
    )
    .expect("manifest");
    std::fs::write(rel.join("germline.toml"), manifest.replace("{DB}", db)).expect("manifest");
    rel
}

/// A corpus server: name, module, entry function, the manifest's `{DB}` value, its
/// command-line arguments, and the calls to make.
type ServerCase = (&'static str, &'static str, &'static str, String, Vec<String>, Value);

/// Issue 16 acceptance: `germline wrap` with the SDK client works for corpus servers
/// configured by their command line (duckdb, make, calculator): the same tools and results
/// as the bare server, each result labelled.
#[test]
fn the_sdk_client_sees_wrapped_corpus_servers_as_the_bare_servers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "tags = [\"projx\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"projx\"]\n[consumers.agent]\nclearance = [\"projx\"]\n",
            data.display()
        ),
    )
    .expect("policy");
    let db = data.join("sales.duckdb");
    let vendor = |name: &str| {
        std::env::var_os("GERMLINE_REAL_SERVERS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/cache/germline/real-servers"))
            .join(name)
            .join("vendor")
    };
    let ok = Command::new(python())
        .arg("-c")
        .arg(format!(
            "import sys; sys.path.insert(0, {:?})\nimport duckdb\nc = duckdb.connect(sys.argv[1])\n\
             c.execute(\"create table sales(region varchar, amount integer)\")\n\
             c.execute(\"insert into sales values ('north', 3), ('south', 5)\")\nc.close()",
            vendor("duckdb")
        ))
        .arg(&db)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "creating the database");
    let project = data.join("project");
    std::fs::create_dir_all(&project).expect("project");
    std::fs::write(project.join("notes.txt"), "a\nb\n").expect("notes");
    std::fs::write(project.join("Makefile"), "hello:\n\t@echo hello\nfail:\n\t@exit 4\n").expect("Makefile");
    let db_s = db.to_string_lossy().into_owned();
    let project_s = project.to_string_lossy().into_owned();
    let servers: [ServerCase; 3] = [
        (
            "duckdb",
            "mcp_server_duckdb",
            "main",
            db_s.clone(),
            vec!["--db-path".into(), db_s.clone(), "--readonly".into()],
            json!([["query", {"query": "SELECT region, amount FROM sales ORDER BY region"}], ["query", {"query": "SELECT * FROM nowhere"}]]),
        ),
        (
            "make",
            "mcp_server_make",
            "main",
            project_s.clone(),
            vec!["--make-path".into(), format!("{project_s}/Makefile"), "--working-dir".into(), project_s.clone()],
            json!([["make", {"target": "hello"}], ["make", {"target": "fail"}]]),
        ),
        (
            "calculator",
            "mcp_server_calculator",
            "main",
            String::new(),
            vec![],
            json!([["calculate", {"expression": "6 * 7"}], ["calculate", {"expression": "1 / 0"}]]),
        ),
    ];
    for (name, module, func, placeholder, argv, calls) in servers {
        let rel = corpus_release(dir.path(), name, &placeholder);
        let bare_code = format!(
            "import sys; sys.path.insert(0, {:?}); sys.argv = [{name:?}] + {argv:?}; from {module} import {func}; {func}()",
            rel.join("vendor")
        );
        let py = python();
        let mut bare = client(&calls, &[py.as_os_str(), "-c".as_ref(), bare_code.as_ref()], &home, false);
        let germline = std::ffi::OsStr::new(env!("CARGO_BIN_EXE_germline"));
        let args: Vec<&std::ffi::OsStr> =
            vec![germline, "wrap".as_ref(), "--policy".as_ref(), policy.as_os_str(), "--".as_ref(), rel.as_os_str()];
        let mut wrapped = client(&calls, &args, &home, false);
        eprintln!("{name} bare: {bare}\n{name} wrapped: {wrapped}");
        let labels = wrapped.as_object_mut().and_then(|o| o.remove("labels")).unwrap_or_default();
        assert!(
            labels.as_array().is_some_and(|a| !a.is_empty() && a.iter().all(Value::is_array)),
            "{name}: labels {labels}"
        );
        wrapped.as_object_mut().map(|o| o.remove("tools_label"));
        bare.as_object_mut().map(|o| (o.remove("labels"), o.remove("tools_label")));
        assert!(bare.get("failed").is_none(), "{name}: the bare server under the SDK client: {bare}");
        assert_eq!(bare, wrapped, "{name}: germline wrap differs from the bare server");
    }
}
