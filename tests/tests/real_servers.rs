//! Issue 4 compatibility run: unmodified official MCP servers from PyPI (vendored by
//! `scripts/setup.sh` into `/var/cache/germline/real-servers`) return the same output
//! under germline as under the unprotected long-lived server, apart from clock values.
//! The sqlite database and the git repository are labelled items of every call.

use std::path::{Path, PathBuf};
use std::process::Command;

use germline_executor::call::CallOutcome;
use germline_executor::policy::Policy;
use germline_executor::runtime::{Runtime, RuntimeKind};
use germline_tests::world::{python, request};
use serde_json::{json, Value};

/// Where `scripts/setup.sh` vendors the servers.
fn real_servers() -> PathBuf {
    std::env::var_os("GERMLINE_REAL_SERVERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/germline/real-servers"))
}

/// A release directory for server `name`: its vendored packages (hard-linked where the
/// file system allows) and the manifest from `tests/real_servers/NAME.toml` with
/// `{DB}` replaced.
fn lay_out(dir: &Path, name: &str, db: &str) -> PathBuf {
    let vendor = real_servers().join(name).join("vendor");
    assert!(
        real_servers().join(name).join(".complete").is_file(),
        "{} is missing: run scripts/setup.sh",
        vendor.display()
    );
    let rel = dir.join(format!("release-{name}"));
    std::fs::create_dir_all(&rel).expect("release dir");
    let linked = Command::new("cp").arg("-rl").arg(&vendor).arg(&rel).status().is_ok_and(|s| s.success());
    if !linked {
        let _ = std::fs::remove_dir_all(rel.join("vendor"));
        let ok = Command::new("cp").arg("-r").arg(&vendor).arg(&rel).status().is_ok_and(|s| s.success());
        assert!(ok, "copying {}", vendor.display());
    }
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("real_servers/{name}.toml")))
            .expect("fixture manifest");
    std::fs::write(rel.join("germline.toml"), manifest.replace("{DB}", db)).expect("manifest");
    rel
}

/// One compatibility run at a time: germline refuses a release for good when a copy's
/// namespace id matches a live copy's, and ids freed by a copy of a concurrent test's
/// germline can be reused before that copy is dropped (reported; `germline.rs`).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn policy(data: &Path, extra: &str) -> Policy {
    Policy::parse(&format!(
        "tags = [\"projx\"]\n[[items]]\npath = \"{}/**\"\nlabel = [\"projx\"]\n{extra}\n[consumers.agent]\nclearance = [\"projx\"]\n",
        data.display()
    ))
    .expect("policy")
}

/// The result as the client sees it, without germline's `_meta` label.
fn bare(o: &CallOutcome) -> Value {
    let mut v = o.result.clone().unwrap_or_else(|| json!({"error": o.error}));
    if let Some(obj) = v.as_object_mut() {
        if let Some(Value::Object(meta)) = obj.get_mut("_meta") {
            meta.remove("dev.germline/label");
            if meta.is_empty() {
                obj.remove("_meta");
            }
        }
    }
    v
}

/// Runs `calls` under sig-pin and germline, compares each result after `normalise`, and
/// returns germline's results.
fn compare(
    rel: &Path,
    policy: Policy,
    home: &Path,
    calls: &[(String, Value)],
    expect_label: Option<&str>,
    normalise: impl Fn(&str, Value) -> Value,
) -> Vec<Value> {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let py = python(home);
    let mut pin = Runtime::start(RuntimeKind::SigPin, rel, policy.clone(), py.clone()).expect("sig-pin start");
    let mut gl = Runtime::start(RuntimeKind::Germline, rel, policy, py).expect("germline start");
    let t0 = std::time::Instant::now();
    let mut results = Vec::new();
    let (mut t_pin, mut t_gl) = (Vec::new(), Vec::new());
    for (i, (tool, args)) in calls.iter().enumerate() {
        let req = request(tool, args.clone(), &[]);
        let t = std::time::Instant::now();
        let a = pin.call(&req);
        t_pin.push(t.elapsed());
        let t = std::time::Instant::now();
        let b = gl.call(&req);
        t_gl.push(t.elapsed());
        assert!(b.error.is_none() || a.error.is_some(), "call {i} {tool} {args}: germline failed: {:?}", b.error);
        assert_eq!(
            normalise(tool, bare(&a)),
            normalise(tool, bare(&b)),
            "call {i}: {tool} {args} differs (left: unprotected, right: germline)"
        );
        if let (Some(want), Some(label)) = (expect_label, &b.label) {
            assert!(label.tags().any(|t| t.as_str() == want), "call {i}: label {label} lacks {want}");
        }
        results.push(bare(&b));
    }
    let p50 = |v: &mut Vec<std::time::Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (a, b) = (p50(&mut t_pin), p50(&mut t_gl));
    eprintln!(
        "{} calls compared in {:?}; P50 unprotected {a:?}, germline {b:?}, ratio {:.2}",
        calls.len(),
        t0.elapsed(),
        b.as_secs_f64() / a.as_secs_f64()
    );
    results
}

fn strip_clock(tool: &str, mut v: Value) -> Value {
    // get_current_time reads the clock: the unprotected server's and the copy's frozen
    // twin clock differ by the call's latency. Check the value is sane, then drop it.
    if tool != "get_current_time" {
        return v;
    }
    let drop_dt = |s: &str| -> String {
        match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(mut m)) => {
                let dt = m.remove("datetime");
                assert!(dt.as_ref().and_then(Value::as_str).is_some_and(|d| d.len() >= 19), "datetime {dt:?}");
                m.remove("day_of_week");
                m.remove("is_dst");
                Value::Object(m).to_string()
            }
            _ => s.to_owned(),
        }
    };
    if let Some(parts) = v.get_mut("content").and_then(Value::as_array_mut) {
        for p in parts {
            if let Some(t) = p.get("text").and_then(Value::as_str).map(drop_dt) {
                p["text"] = json!(t);
            }
        }
    }
    if let Some(Value::Object(s)) = v.get_mut("structuredContent") {
        s.remove("datetime");
        s.remove("day_of_week");
        s.remove("is_dst");
    }
    v
}

#[test]
fn mcp_server_time_matches_unprotected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let rel = lay_out(dir.path(), "time", "");
    let zones = ["Europe/London", "Asia/Tokyo", "America/New_York", "Australia/Sydney", "UTC", "Nowhere/Invalid"];
    let mut calls = Vec::new();
    for i in 0..200 {
        let tz = zones[i % zones.len()];
        calls.push(("get_current_time".to_owned(), json!({"timezone": tz})));
    }
    for i in 0..200 {
        let (s, t) = (zones[i % zones.len()], zones[(i / zones.len()) % zones.len()]);
        let time = format!("{:02}:{:02}", i % 24, (i * 7) % 60);
        let time = if i % 50 == 49 { "25:99".to_owned() } else { time };
        calls.push(("convert_time".to_owned(), json!({"source_timezone": s, "time": time, "target_timezone": t})));
    }
    compare(&rel, policy(&data, ""), &dir.path().join("home"), &calls, None, strip_clock);
}

#[test]
fn mcp_server_sqlite_matches_unprotected_with_the_database_as_an_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let db = data.join("shop.db");
    let py = python(&dir.path().join("home")).python;
    let made = Command::new(&py)
        .arg("-c")
        .arg(
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\n\
             c.execute('create table customers(id integer primary key, name text, city text)')\n\
             c.execute('create table orders(id integer primary key, customer integer, total real)')\n\
             c.executemany('insert into customers(name, city) values (?,?)', [('c%d' % i, 'city%d' % (i % 7)) for i in range(50)])\n\
             c.executemany('insert into orders(customer, total) values (?,?)', [(i % 50, i * 1.5) for i in range(200)])\n\
             c.commit()",
        )
        .arg(&db)
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "creating the database");
    let rel = lay_out(dir.path(), "sqlite", &db.to_string_lossy());
    let mut calls = Vec::new();
    for i in 0..30 {
        calls.push(("list_tables".to_owned(), json!({})));
        let table = ["customers", "orders", "missing"][i % 3];
        calls.push(("describe_table".to_owned(), json!({"table_name": table})));
        let q = match i % 4 {
            0 => format!("SELECT * FROM customers WHERE id <= {}", i + 1),
            1 => format!("SELECT city, COUNT(*) AS n FROM customers GROUP BY city HAVING n > {}", i % 5),
            2 => format!("SELECT SUM(total) AS s FROM orders WHERE customer = {i}"),
            _ => "SELECT * FROM nowhere".to_owned(),
        };
        calls.push(("read_query".to_owned(), json!({"query": q})));
    }
    compare(&rel, policy(&data, ""), &dir.path().join("home"), &calls, Some("projx"), |_, v| v);
}

#[test]
fn mcp_server_git_matches_unprotected_with_the_repository_as_an_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let repo = data.join("repo");
    std::fs::create_dir_all(&repo).expect("repo");
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .args(args)
            .current_dir(&repo)
            .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["config", "user.email", "dev@example.org"]);
    git(&["config", "user.name", "Dev"]);
    for i in 0..5 {
        std::fs::write(repo.join(format!("f{i}.txt")), format!("line {i}\n")).expect("file");
        git(&["add", "."]);
        git(&["commit", "-q", "-m", &format!("commit {i}")]);
    }
    std::fs::write(repo.join("f0.txt"), "changed\n").expect("file");
    let rel = lay_out(dir.path(), "git", "");
    let extra = "[[items]]\nargument = \"repo_path\"\nnames_path = true\n";
    let r = repo.to_string_lossy().into_owned();
    let mut calls = Vec::new();
    for i in 0..30 {
        calls.push(("git_log".to_owned(), json!({"repo_path": r, "max_count": 1 + i % 6})));
        let rev = ["HEAD", "HEAD~1", "HEAD~3", "nope"][i % 4];
        calls.push(("git_show".to_owned(), json!({"repo_path": r, "revision": rev})));
        calls.push(("git_diff_unstaged".to_owned(), json!({"repo_path": r, "context_lines": i % 4})));
        // A target git rejects (a blob): the server shells out to `git diff`, which fails;
        // under germline the copy must collect that exit status as the bare server does.
        let target = ["HEAD~1", "HEAD:f0.txt"][i % 2];
        calls.push(("git_diff".to_owned(), json!({"repo_path": r, "target": target})));
    }
    compare(&rel, policy(&data, extra), &dir.path().join("home"), &calls, Some("projx"), |_, v| v);
}

/// A loopback web site: `/robots.txt` allows everything, `/notes/N.txt` is plain text,
/// anything else a small HTML page.
fn start_site() -> std::net::SocketAddr {
    serve_site(|path| {
        if path.ends_with("/robots.txt") {
            ("text/plain", "User-agent: *\nAllow: /\n".to_owned())
        } else if path.starts_with("/notes/") {
            ("text/plain", format!("Plain notes at {path}.\nSecond line, long enough to be cut by max_length.\n"))
        } else {
            (
                "text/html",
                format!(
                    "<html><head><title>Page {path}</title></head><body><h1>Heading {path}</h1>\
                     <p>Some text for {path}, with <a href=\"/x\">a link</a>.</p><ul><li>one</li><li>two</li></ul></body></html>"
                ),
            )
        }
    })
}

/// A loopback HTTP site answering every GET or POST with `route(path)` (content type,
/// body), one connection per request.
fn serve_site(route: fn(&str) -> (&'static str, String)) -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("site");
    let addr = listener.local_addr().expect("site address");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                let mut reader = BufReader::new(&conn);
                let mut first = String::new();
                if reader.read_line(&mut first).is_err() {
                    return;
                }
                let mut line = String::new();
                let mut length = 0usize;
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line.trim() != "" {
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0).min(1 << 16);
                    }
                    line.clear();
                }
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body);
                let path = first.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let (ctype, body) = route(&path);
                let mut w = &conn;
                let _ = write!(
                    w,
                    "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

/// A real server reaching `host`, an HTTPS site on loopback: the site behind a TLS front
/// whose certificate a test CA signs, the policy trusting that CA, mapping `host` to the
/// front and clearing it for nothing; the release laid out with `db` for `{DB}`.
struct HttpsCase {
    dir: tempfile::TempDir,
    data: PathBuf,
    rel: PathBuf,
    extra: String,
    front: germline_tests::TlsFront,
}

impl HttpsCase {
    fn new(name: &str, host: &str, site: std::net::SocketAddr, db: impl Fn(&Path) -> String) -> HttpsCase {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data");
        let ca = germline_tests::TestCa::new(&format!("{host} test CA"));
        let front = germline_tests::TlsFront::start(site, ca.server_config(&[host]));
        let ca_path = ca.write_cert(&dir.path().join(format!("{name}-ca.pem")));
        let rel = lay_out(dir.path(), name, &db(dir.path()));
        let extra = format!(
            "[destinations.\"{host}\"]\nclearance = []\n[hosts]\n\"{host}\" = \"{}\"\n[tls]\nextra_roots = [\"{}\"]\n",
            front.tls_addr(),
            ca_path.display()
        );
        HttpsCase { dir, data, rel, extra, front }
    }

    /// Runs `calls` unprotected and under germline ([`compare`]).
    fn compare(&self, calls: &[(String, Value)]) -> Vec<Value> {
        compare(&self.rel, policy(&self.data, &self.extra), &self.dir.path().join("home"), calls, None, |_, v| v)
    }
}

/// 200 fetches of a loopback HTTPS site through the broker's TLS relay (the site's
/// certificate is verified against a test CA the policy trusts; the copy trusts only the
/// deployment CA). HTML simplification (`raw` false on an HTML page) is left out: with
/// `node` on PATH, readabilipy runs `npm install`, whose output lands on the unprotected
/// server's MCP stdout and breaks it, while a confined copy cannot start node and falls
/// back to Python; non-raw calls therefore fetch plain-text pages.
#[test]
fn mcp_server_fetch_matches_unprotected_over_https() {
    let case = HttpsCase::new("fetch", "site.example", start_site(), |_| String::new());
    let mut calls = Vec::new();
    for i in 0..200 {
        let mut args = if i % 4 == 1 {
            json!({"url": format!("https://site.example/notes/{i}.txt")})
        } else {
            json!({"url": format!("https://site.example/page/{i}"), "raw": true})
        };
        if i % 5 == 0 {
            args["max_length"] = json!(40);
        }
        if i % 7 == 3 {
            args["start_index"] = json!(10);
        }
        calls.push(("fetch".to_owned(), args));
    }
    let results = case.compare(&calls);
    for (i, r) in results.iter().enumerate() {
        let text = r["content"][0]["text"].as_str().unwrap_or_default();
        assert!(
            r["isError"] == json!(false) && text.contains("Contents of https://site.example/"),
            "call {i} fetched nothing: {r}"
        );
    }
    let handshakes = case.front.handshakes();
    assert!(handshakes >= 400, "{handshakes} TLS handshakes: every fetch went to the site over TLS");
}

/// Runs `code` with the vendored packages of `name` on the path (to build test data with
/// the server's own libraries).
fn with_vendor(name: &str, home: &Path, code: &str, arg: &Path) {
    let py = python(home).python;
    let vendor = real_servers().join(name).join("vendor");
    let ok = Command::new(&py)
        .arg("-c")
        .arg(format!("import sys; sys.path.insert(0, {vendor:?})\n{code}"))
        .arg(arg)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "preparing test data for {name}");
}

/// A DuckDB database of 100 sales rows built with server `name`'s own duckdb, laid out as
/// an item, and 20 queries through `tool` (its SQL argument `arg`): aggregates, filters, a
/// missing table and a refused write.
fn compare_sales_queries(name: &str, tool: &str, arg: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let db = data.join("sales.duckdb");
    let home = dir.path().join("home");
    with_vendor(
        name,
        &home,
        "import duckdb\nc = duckdb.connect(sys.argv[1])\n\
         c.execute(\"create table sales(region varchar, amount decimal(10,2), day date)\")\n\
         c.execute(\"insert into sales select 'r' || CAST(i % 4 AS VARCHAR), i * 1.25, DATE '2026-01-01' + CAST(i AS INTEGER) from range(100) t(i)\")\n\
         c.close()",
        &db,
    );
    let rel = lay_out(dir.path(), name, &db.to_string_lossy());
    let mut calls = Vec::new();
    for i in 0..20 {
        let q = match i % 5 {
            0 => "SELECT region, SUM(amount) AS total FROM sales GROUP BY region ORDER BY region".to_owned(),
            1 => format!("SELECT * FROM sales WHERE amount > {} ORDER BY day LIMIT 3", i * 5),
            2 => "SELECT COUNT(*), MIN(day), MAX(day) FROM sales".to_owned(),
            3 => "SELECT * FROM nowhere".to_owned(),
            _ => "INSERT INTO sales VALUES ('x', 1, DATE '2026-01-01')".to_owned(),
        };
        calls.push((tool.to_owned(), json!({ arg: q })));
    }
    compare(&rel, policy(&data, ""), &home, &calls, Some("projx"), |_, v| v);
}

/// Issue 16: mcp-server-duckdb, configured by `--db-path` on its command line and run
/// through its own `main` (`cli` in the manifest), with the database as an item.
#[test]
fn mcp_server_duckdb_matches_unprotected_with_the_database_as_an_item() {
    compare_sales_queries("duckdb", "query", "query");
}

/// Issue 16, point 1: mcp-server-motherduck, whose duckdb starts a worker thread when it
/// is imported (G1 refuses a germline that imported it): its copies are spawned
/// (`copy_source = "spawn"` in its manifest), each importing the release itself.
#[test]
fn mcp_server_motherduck_matches_unprotected_with_spawned_copies() {
    compare_sales_queries("motherduck", "execute_query", "sql");
}

/// Issue 16: excel-mcp-server (an office-document server) through its own command line,
/// reading a workbook named by the `path` argument.
#[test]
fn excel_mcp_server_matches_unprotected_with_the_workbook_as_an_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let book = data.join("budget.xlsx");
    let home = dir.path().join("home");
    with_vendor(
        "excel",
        &home,
        "import openpyxl\nwb = openpyxl.Workbook()\nws = wb.active\nws.title = 'Budget'\n\
         ws.append(['item', 'q1', 'q2', 'total'])\n\
         [ws.append(['line %d' % i, i * 10, i * 7, '=B%d+C%d' % (i + 2, i + 2)]) for i in range(12)]\n\
         wb.create_sheet('Notes').append(['reviewed', True])\nwb.save(sys.argv[1])",
        &book,
    );
    let rel = lay_out(dir.path(), "excel", "");
    let extra = "[[items]]\nargument = \"path\"\nnames_path = true\n";
    let b = book.to_string_lossy().into_owned();
    let mut calls = Vec::new();
    for i in 0..10 {
        calls.push(("describe_workbook".to_owned(), json!({"path": b})));
        let range = ["A1:D5", "B2:C13", "D1:D13", "ZZ1:ZZ2"][i % 4];
        calls.push(("read_range".to_owned(), json!({"path": b, "sheet": "Budget", "range": range})));
        calls.push(("find_cells".to_owned(), json!({"path": b, "sheet": "Budget", "query": format!("line {i}")})));
    }
    calls.push(("read_range".to_owned(), json!({"path": b, "sheet": "Missing"})));
    compare(&rel, policy(&data, extra), &home, &calls, Some("projx"), |_, v| v);
}

/// Issue 16: mcp-server-make runs `make` on a Makefile that is an item; failing targets
/// must fail as unprotected (their exit statuses reach the server, point 9).
#[test]
fn mcp_server_make_matches_unprotected_with_the_makefile_as_an_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let project = data.join("project");
    std::fs::create_dir_all(&project).expect("project");
    std::fs::write(project.join("notes.txt"), "alpha\nbeta\ngamma\n").expect("notes");
    std::fs::write(
        project.join("Makefile"),
        ".PHONY: hello count fail words\nhello:\n\t@echo hello from make\ncount:\n\t@wc -l < notes.txt\n\
         fail:\n\t@echo about to fail; exit 3\nwords:\n\t@grep -c a notes.txt\n",
    )
    .expect("Makefile");
    let rel = lay_out(dir.path(), "make", &project.to_string_lossy());
    let mut calls = Vec::new();
    for i in 0..12 {
        let target = ["hello", "count", "fail", "words", "missing"][i % 5];
        calls.push(("make".to_owned(), json!({"target": target})));
    }
    let results = compare(&rel, policy(&data, ""), &dir.path().join("home"), &calls, Some("projx"), |_, v| v);
    let failing = results[2].to_string();
    assert!(failing.contains("Error 3") || failing.contains("exit"), "the failing target failed: {failing}");
}

/// Issue 16: mcp-server-calculator, through its command-line entry point.
#[test]
fn mcp_server_calculator_matches_unprotected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let rel = lay_out(dir.path(), "calculator", "");
    let exprs = ["2 + 3 * 4", "sqrt(2) ^ 2", "10 / 0", "factorial(20)", "log(e)", "nope(1)", "2 ** 0.5", "-7 // 2"];
    let calls: Vec<(String, serde_json::Value)> =
        (0..40).map(|i| ("calculate".to_owned(), json!({"expression": exprs[i % exprs.len()]}))).collect();
    compare(&rel, policy(&data, ""), &dir.path().join("home"), &calls, None, |_, v| v);
}

/// Issue 16: office-word-mcp-server, which registers its tools inside its command-line
/// entry point, reading a .docx named by the `filename` argument.
#[test]
fn office_word_mcp_server_matches_unprotected_with_the_document_as_an_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let doc = data.join("minutes.docx");
    let home = dir.path().join("home");
    with_vendor(
        "word",
        &home,
        "import docx\nd = docx.Document()\nd.add_heading('Minutes', 0)\nd.add_heading('Budget', 1)\n\
         [d.add_paragraph('Item %d: the budget line %d was approved.' % (i, i * 3)) for i in range(8)]\n\
         d.add_heading('Next steps', 1)\nd.add_paragraph('Review in March.')\nd.save(sys.argv[1])",
        &doc,
    );
    let rel = lay_out(dir.path(), "word", "");
    let extra = "[[items]]\nargument = \"filename\"\nnames_path = true\n";
    let f = doc.to_string_lossy().into_owned();
    let mut calls = Vec::new();
    for i in 0..6 {
        calls.push(("get_document_text".to_owned(), json!({"filename": f})));
        calls.push(("get_document_outline".to_owned(), json!({"filename": f})));
        calls.push(("get_paragraph_text_from_document".to_owned(), json!({"filename": f, "paragraph_index": i * 2})));
        let needle = ["budget", "March", "absent", "Item 3"][i % 4];
        calls.push(("find_text_in_document".to_owned(), json!({"filename": f, "text_to_find": needle})));
    }
    compare(&rel, policy(&data, extra), &home, &calls, Some("projx"), |_, v| v);
}

/// Issue 16: office-powerpoint-mcp-server (its FastMCP server is a module attribute),
/// reading a deck named by `file_path` / `template_path`. The server keeps opened decks
/// in process memory; the calls name their id, so none depends on an earlier call.
#[test]
fn office_powerpoint_mcp_server_matches_unprotected_with_the_deck_as_an_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let deck = data.join("deck.pptx");
    let home = dir.path().join("home");
    with_vendor(
        "pptx",
        &home,
        "from pptx import Presentation\np = Presentation()\n\
         for i in range(3):\n    s = p.slides.add_slide(p.slide_layouts[1]); s.shapes.title.text = 'Slide %d: results' % (i + 1)\n    s.placeholders[1].text = 'Revenue grew %d%% in region %d' % (i * 5, i)\n\
         p.core_properties.title = 'Quarterly deck'\np.save(sys.argv[1])",
        &deck,
    );
    let rel = lay_out(dir.path(), "pptx", "");
    let extra = "[[items]]\nargument = \"file_path\"\nnames_path = true\n[[items]]\nargument = \"template_path\"\nnames_path = true\n";
    let d = deck.to_string_lossy().into_owned();
    let missing = data.join("missing.pptx").to_string_lossy().into_owned();
    let mut calls = Vec::new();
    for i in 0..3 {
        calls.push(("open_presentation".to_owned(), json!({"file_path": d, "id": format!("deck{i}")})));
        calls.push(("get_template_file_info".to_owned(), json!({"template_path": d})));
    }
    let results = compare(&rel, policy(&data, extra), &home, &calls, Some("projx"), |_, v| v);
    assert!(results[0].to_string().contains("slide_count"), "the deck opened: {}", results[0]);
    // A deck that does not exist names no item: its answer carries no label.
    let calls = [("open_presentation".to_owned(), json!({"file_path": missing, "id": "gone"}))];
    compare(&rel, policy(&data, extra), &home, &calls, None, |_, v| v);
}

/// Issue 16: mcp-server-tree-sitter, through its command line: the language-level tools
/// (grammars, node types, query building) that need no project.
#[test]
fn mcp_server_tree_sitter_matches_unprotected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let rel = lay_out(dir.path(), "treesitter", "");
    let mut calls = vec![("list_languages".to_owned(), json!({}))];
    for lang in ["python", "javascript", "cobol"] {
        calls.push(("check_language_available".to_owned(), json!({"language": lang})));
    }
    calls.push(("get_node_types".to_owned(), json!({"language": "python"})));
    calls.push(("build_query".to_owned(), json!({"language": "python", "patterns": ["function", "class"]})));
    calls.push((
        "adapt_query".to_owned(),
        json!({"query": "(function_definition) @f", "from_language": "python", "to_language": "javascript"}),
    ));
    compare(&rel, policy(&data, ""), &dir.path().join("home"), &calls, None, |_, v| v);
}

/// A directory of small text files, dated, for the servers that run commands on it.
fn command_directory(data: &Path) {
    std::fs::create_dir_all(data).expect("data");
    std::fs::write(data.join("notes.txt"), "alpha\nbeta\ngamma\n").expect("notes");
    std::fs::write(data.join("people.csv"), "id,name\n1,ann\n2,bob\n").expect("people");
}

/// Issue 16: cli-mcp-server, configured by its environment (`[release] env`: the directory
/// it runs commands in and the commands it allows), runs `cat`, `wc`, `grep` and `ls` on
/// the directory's files as items; a refused command and a failing one answer as
/// unprotected.
#[test]
fn cli_mcp_server_matches_unprotected_with_the_directory_as_items() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    command_directory(&data);
    let rel = lay_out(dir.path(), "climcp", &data.to_string_lossy());
    let commands =
        ["cat notes.txt", "wc -l people.csv", "grep -c a notes.txt", "cat missing.txt", "rm notes.txt", "ls -a"];
    let calls: Vec<(String, Value)> =
        commands.iter().map(|c| ("run_command".to_owned(), json!({"command": c}))).collect();
    let home = dir.path().join("home");
    let results = compare(&rel, policy(&data, ""), &home, &calls, Some("projx"), |_, v| v);
    assert!(results[0].to_string().contains("alpha\\nbeta"), "cat read the file: {}", results[0]);
    // The rules read no file: that answer carries no label.
    compare(&rel, policy(&data, ""), &home, &[("show_security_rules".to_owned(), json!({}))], None, |_, v| v);
}

/// Issue 16: mcp-shell-server, configured by its environment, runs commands in the
/// directory a call names; the files are items.
#[test]
fn mcp_shell_server_matches_unprotected_with_the_directory_as_items() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    command_directory(&data);
    let rel = lay_out(dir.path(), "shell", &data.to_string_lossy());
    let d = data.to_string_lossy().into_owned();
    let commands: [&[&str]; 6] = [
        &["cat", "notes.txt"],
        &["sort", "-r", "notes.txt"],
        &["grep", "-c", "a", "notes.txt"],
        &["cat", "missing.txt"],
        &["rm", "notes.txt"],
        &["ls"],
    ];
    let calls: Vec<(String, Value)> =
        commands.iter().map(|c| ("shell_execute".to_owned(), json!({"command": c, "directory": d}))).collect();
    let results = compare(&rel, policy(&data, ""), &dir.path().join("home"), &calls, Some("projx"), |_, v| v);
    assert!(results[1].to_string().contains("gamma\\nbeta\\nalpha"), "sort ran: {}", results[1]);
}

/// Issue 16: mcp-server-jupyter reads a notebook named by `notebook_path` (its cells,
/// sources and a cell's stored outputs; running cells needs a kernel and is left out).
#[test]
fn mcp_server_jupyter_matches_unprotected_with_the_notebook_as_an_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let nb = data.join("sales.ipynb");
    let cell = |id: &str, kind: &str, source: &str, outputs: Value| {
        let mut c = json!({"cell_type": kind, "id": id, "metadata": {}, "source": [source]});
        if kind == "code" {
            c["execution_count"] = json!(1);
            c["outputs"] = outputs;
        }
        c
    };
    let notebook = json!({
        "cells": [
            cell("intro", "markdown", "# Sales\nTotals per region.", json!(null)),
            cell("load", "code", "totals = {'north': 10, 'south': 7}\ntotals",
                 json!([{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                         "data": {"text/plain": ["{'north': 10, 'south': 7}"]}}])),
            cell("sum", "code", "print(sum(totals.values()))",
                 json!([{"output_type": "stream", "name": "stdout", "text": ["17\n"]}])),
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5
    });
    std::fs::write(&nb, serde_json::to_string_pretty(&notebook).expect("json")).expect("notebook");
    let rel = lay_out(dir.path(), "jupyter", "");
    let extra = "[[items]]\nargument = \"notebook_path\"\nnames_path = true\n";
    let p = nb.to_string_lossy().into_owned();
    let calls = vec![
        ("read_notebook_with_outputs".to_owned(), json!({"notebook_path": p})),
        ("read_notebook_source_only".to_owned(), json!({"notebook_path": p})),
        ("read_output_of_cell".to_owned(), json!({"notebook_path": p, "cell_id": "sum"})),
        ("read_output_of_cell".to_owned(), json!({"notebook_path": p, "cell_id": "load"})),
        ("read_output_of_cell".to_owned(), json!({"notebook_path": p, "cell_id": "nope"})),
    ];
    let results = compare(&rel, policy(&data, extra), &dir.path().join("home"), &calls, Some("projx"), |_, v| v);
    assert!(results[2].to_string().contains("17\\n"), "the cell's output: {}", results[2]);
}

/// Issue 16: code-index-mcp indexes the project named by `--project-path` as it starts
/// (in each copy, whose view holds the project's files) and answers file, search and
/// symbol queries; `find_files` returns files in directory-listing order, which the copy's
/// view keeps.
#[test]
fn code_index_mcp_matches_unprotected_with_the_project_as_items() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let src = data.join("src");
    std::fs::create_dir_all(&src).expect("src");
    std::fs::write(
        src.join("ledger.py"),
        "def total(xs):\n    \"\"\"Sum of xs.\"\"\"\n    return sum(xs)\n\nclass Ledger:\n    def add(self, x):\n        return total([x, 1])\n",
    )
    .expect("py");
    std::fs::write(
        src.join("app.js"),
        "import { total } from \"./ledger\";\nexport function twice(x) { return total([x, x]); }\n",
    )
    .expect("js");
    std::fs::write(src.join("util.py"), "def ident(x):\n    return x\n").expect("py");
    std::fs::write(data.join("README.md"), "# Project\nA ledger.\n").expect("readme");
    let rel = lay_out(dir.path(), "codeindex", "");
    // The manifest's `{item:project}` placeholder, filled by the deployment.
    let startup = format!("[startup_items]\nproject = \"{}\"\n", data.display());
    let calls = vec![
        ("find_files".to_owned(), json!({"pattern": "*.py"})),
        ("find_files".to_owned(), json!({"pattern": "src/*"})),
        ("search_code_advanced".to_owned(), json!({"pattern": "total"})),
        ("get_file_summary".to_owned(), json!({"file_path": "src/ledger.py"})),
        ("get_symbol_body".to_owned(), json!({"file_path": "src/ledger.py", "symbol_name": "total"})),
    ];
    let results = compare(&rel, policy(&data, &startup), &dir.path().join("home"), &calls, Some("projx"), |_, v| v);
    assert!(results[1].to_string().contains("src/app.js"), "the project was indexed: {}", results[1]);
}

/// Issue 16: database-mcp-sqlite, configured by `--dsn` on its command line, with the
/// database as an item: listing objects, queries, a failing query and a refused write.
#[test]
fn database_mcp_sqlite_matches_unprotected_with_the_database_as_an_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let db = data.join("shop.db");
    let py = python(&dir.path().join("home")).python;
    let made = Command::new(&py)
        .arg("-c")
        .arg(
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\n\
             c.execute('create table customers(id integer primary key, name text, city text)')\n\
             c.execute('create index idx_city on customers(city)')\n\
             c.execute('create view big_cities as select city, count(*) n from customers group by city')\n\
             c.executemany('insert into customers(name, city) values (?,?)', [('c%d' % i, 'city%d' % (i % 7)) for i in range(50)])\n\
             c.commit()",
        )
        .arg(&db)
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "creating the database");
    let rel = lay_out(dir.path(), "dbsqlite", "");
    // The manifest's `{item:db}` placeholder, filled by the deployment.
    let startup = format!("[startup_items]\ndb = \"{}\"\n", db.display());
    let calls = vec![
        ("search_objects".to_owned(), json!({})),
        ("search_objects".to_owned(), json!({"table": "customers"})),
        ("execute_sql".to_owned(), json!({"sql": "SELECT city, COUNT(*) AS n FROM customers GROUP BY city"})),
        ("execute_sql".to_owned(), json!({"sql": "SELECT * FROM big_cities WHERE n > 7"})),
        ("execute_sql".to_owned(), json!({"sql": "SELECT * FROM nowhere"})),
        ("execute_sql".to_owned(), json!({"sql": "DELETE FROM customers"})),
    ];
    let results = compare(&rel, policy(&data, &startup), &dir.path().join("home"), &calls, Some("projx"), |_, v| v);
    assert!(results[2].to_string().contains("city0"), "the query ran: {}", results[2]);
}

/// Issue 16: mcp-pandoc runs the `pandoc` binary (a GHC program: under germline it starts
/// with `GHCRTS=-V0`, since the copy's seccomp filter refuses the `timerfd` its runtime's
/// ticker needs) on inline contents and on a document named by `input_file`.
#[test]
fn mcp_pandoc_matches_unprotected_with_the_document_as_an_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let doc = data.join("minutes.md");
    std::fs::write(
        &doc,
        "# Minutes\n\nThe *budget* was approved.\n\n- item one\n- item two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n",
    )
    .expect("document");
    let rel = lay_out(dir.path(), "pandoc", "");
    let extra = "[[items]]\nargument = \"input_file\"\nnames_path = true\n";
    let d = doc.to_string_lossy().into_owned();
    let convert = |args: Value| ("convert-contents".to_owned(), args);
    let home = dir.path().join("home");
    let calls = vec![
        convert(json!({"input_file": d, "input_format": "markdown", "output_format": "txt"})),
        convert(json!({"input_file": d, "input_format": "markdown", "output_format": "html"})),
    ];
    let results = compare(&rel, policy(&data, extra), &home, &calls, Some("projx"), |_, v| v);
    assert!(results[1].to_string().contains("<em>budget</em>"), "pandoc converted the file: {}", results[1]);
    let calls = vec![
        convert(json!({"contents": "# Title\n\nSome *text*.", "input_format": "markdown", "output_format": "html"})),
        convert(json!({"contents": "<p>Hi <b>there</b></p>", "input_format": "html", "output_format": "markdown"})),
        convert(json!({"contents": "x", "input_format": "nope", "output_format": "html"})),
    ];
    let results = compare(&rel, policy(&data, extra), &home, &calls, None, |_, v| v);
    assert!(results[1].to_string().contains("**there**"), "pandoc converted the contents: {}", results[1]);
}

/// A loopback news site: `/` links its RSS feed, `/feed.xml`, anything else is a page
/// without a feed (one feed only: the server probes common feed paths concurrently and
/// takes the first that answers, which with several feeds depends on timing).
fn start_news_site() -> std::net::SocketAddr {
    serve_site(|path| {
        if path == "/feed.xml" {
            let items: String = (1..=4)
                .map(|i| {
                    format!(
                        "<item><title>Story {i}</title><link>https://news.example/story/{i}</link>\
                         <description>Summary of story {i}.</description><guid>story-{i}</guid>\
                         <pubDate>Mon, 0{i} Jun 2026 10:00:00 GMT</pubDate></item>"
                    )
                })
                .collect();
            (
                "application/rss+xml",
                format!(
                    "<?xml version=\"1.0\"?><rss version=\"2.0\"><channel><title>Loopback News</title>\
                     <link>https://news.example/</link><description>Test feed</description>{items}</channel></rss>"
                ),
            )
        } else if path == "/" {
            (
                "text/html",
                "<html><head><title>News</title><link rel=\"alternate\" type=\"application/rss+xml\" \
                 href=\"/feed.xml\"></head><body>News</body></html>"
                    .to_owned(),
            )
        } else {
            ("text/html", format!("<html><head><title>{path}</title></head><body>No feed here.</body></html>"))
        }
    })
}

/// Issue 16: mcp-server-rss finds the feed a loopback HTTPS site links and parses it
/// (httpx for the page, feedparser's urllib for the feed), through the broker's TLS relay.
#[test]
fn mcp_server_rss_matches_unprotected_over_https() {
    let case = HttpsCase::new("rss", "news.example", start_news_site(), |_| String::new());
    let calls = vec![
        ("feed".to_owned(), json!({"url": "https://news.example/", "limit": 3})),
        ("feed".to_owned(), json!({"url": "https://news.example/feed.xml", "limit": 2})),
        ("feed".to_owned(), json!({"url": "https://news.example/nothing"})),
    ];
    let results = case.compare(&calls);
    assert!(results[0].to_string().contains("Story 1"), "the feed was parsed: {}", results[0]);
}

/// A loopback stand-in for a search engine's HTML results page: three results (one an
/// ad, which the server skips), links through the engine's redirect.
fn start_search_site() -> std::net::SocketAddr {
    serve_site(|_| {
        let result = |i: usize, href: String| {
            format!(
                "<div class=\"result results_links web-result\"><h2 class=\"result__title\">\
                 <a class=\"result__a\" href=\"{href}\">Result {i} title</a></h2>\
                 <a class=\"result__snippet\">Snippet of result {i}, about loopback testing.</a></div>"
            )
        };
        let body = [
            result(1, "//duckduckgo.com/l/?uddg=https%3A%2F%2Fdocs.example%2Fone&rut=x".into()),
            result(2, "https://ads.example/y.js?ad=1".into()),
            result(3, "https://docs.example/three".into()),
        ]
        .concat();
        ("text/html", format!("<html><body><div class=\"results\">{body}</div></body></html>"))
    })
}

/// Issue 16: duckduckgo-mcp-server's `search` posts to the search engine (a declared
/// destination, mapped to a loopback HTTPS site) and formats the results it parses.
#[test]
fn duckduckgo_mcp_server_search_matches_unprotected_over_https() {
    let case = HttpsCase::new("ddg", "html.duckduckgo.com", start_search_site(), |_| String::new());
    let calls = vec![
        ("search".to_owned(), json!({"query": "loopback testing"})),
        ("search".to_owned(), json!({"query": "loopback testing", "max_results": 1})),
        ("search".to_owned(), json!({"query": "germline", "region": "uk-en"})),
    ];
    let results = case.compare(&calls);
    let text = results[0].to_string();
    assert!(text.contains("docs.example/one") && !text.contains("ads.example"), "results parsed: {text}");
    let handshakes = case.front.handshakes();
    assert!(handshakes >= 6, "{handshakes} TLS handshakes: every search reached the site");
}

/// A loopback calendar site: `/team.ics` is an iCalendar feed (a weekly recurring
/// meeting and two single events), anything else a page.
fn start_calendar_site() -> std::net::SocketAddr {
    serve_site(|path| {
        if path != "/team.ics" {
            return ("text/html", "<html><body>No calendar here.</body></html>".to_owned());
        }
        let event = |uid: &str, start: &str, end: &str, summary: &str, extra: &str| {
            format!(
                "BEGIN:VEVENT\r\nUID:{uid}\r\nDTSTAMP:20260101T000000Z\r\nDTSTART:{start}\r\nDTEND:{end}\r\n\
                 SUMMARY:{summary}\r\n{extra}END:VEVENT\r\n"
            )
        };
        let body = [
            "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//loopback//test//EN\r\nX-WR-CALNAME:Team\r\n".to_owned(),
            event("standup", "20260601T090000Z", "20260601T091500Z", "Standup", "RRULE:FREQ=WEEKLY;COUNT=6\r\n"),
            event(
                "budget",
                "20260603T140000Z",
                "20260603T150000Z",
                "Budget review",
                "LOCATION:Room 4\r\nDESCRIPTION:Quarterly numbers.\r\nCATEGORIES:finance\r\n",
            ),
            event("offsite", "20260615T080000Z", "20260615T170000Z", "Offsite", "LOCATION:Lakeside\r\n"),
            "END:VCALENDAR\r\n".to_owned(),
        ]
        .concat();
        ("text/calendar", body)
    })
}

/// Issue 16: webcal-mcp, configured by a file its environment names, reads a team
/// calendar from a loopback HTTPS feed: calendars, events in a window (recurrences
/// expanded), one day, one event.
#[test]
fn webcal_mcp_matches_unprotected_over_https() {
    // The configuration ships in the release directory, named relative to it (the working
    // directory, wherever a germline's root or the host holds it).
    let case = HttpsCase::new("webcal", "cal.example", start_calendar_site(), |_| "webcal.toml".to_owned());
    std::fs::write(
        case.rel.join("webcal.toml"),
        "[calendars.team]\nurl = \"https://cal.example/team.ics\"\ndescription = \"Team calendar\"\n",
    )
    .expect("config");
    let calls = vec![
        ("list_calendars".to_owned(), json!({})),
        ("list_events".to_owned(), json!({"start": "2026-06-01", "end": "2026-06-30"})),
        (
            "list_events".to_owned(),
            json!({"start": "2026-06-01", "end": "2026-06-30", "query": "budget", "detail": "full"}),
        ),
        ("events_on".to_owned(), json!({"date": "2026-06-15", "detail": "markdown"})),
        ("get_event".to_owned(), json!({"uid": "budget"})),
        ("get_event".to_owned(), json!({"uid": "missing"})),
    ];
    let results = case.compare(&calls);
    assert!(results[1].to_string().contains("Standup"), "the feed was read: {}", results[1]);
}

/// Writes small PDFs (text pages, a title) and a file that only claims to be one.
const MAKE_PDFS: &str = r#"
import sys
def pdf(path, pages, title):
    objs = []
    objs.append("<< /Type /Catalog /Pages 2 0 R >>")
    kids = " ".join(f"{4 + 2*i} 0 R" for i in range(len(pages)))
    objs.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>")
    objs.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2*i} 0 R >>")
        stream = "BT /F1 18 Tf 72 720 Td (" + text + ") Tj ET"
        objs.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out = b"%PDF-1.4\n"
    offsets = []
    for n, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n{o}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objs)+1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objs)+1} /Root 1 0 R /Info << /Title ({title}) >> >>\nstartxref\n{xref}\n%%EOF\n".encode()
    open(path, "wb").write(out)
d = sys.argv[1]
pdf(d + "/report.pdf", ["Quarterly report page one", "Region totals: north 10, south 7"], "Quarterly report")
pdf(d + "/memo.pdf", ["Memo: budget approved"], "Memo")
open(d + "/broken.pdf", "wb").write(b"%PDF-1.4 not really a pdf")
"#;

/// Issue 16: fastmcp-pdftools extracts PDF text with pypdf (a document named by `path`)
/// and lists a directory's PDFs with sizes and modification times (`directory`: the
/// directory's files are items; the view keeps their metadata and listing order).
#[test]
fn fastmcp_pdftools_matches_unprotected_with_the_documents_as_items() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let py = python(&dir.path().join("home")).python;
    let made = Command::new(&py).arg("-c").arg(MAKE_PDFS).arg(&data).status().is_ok_and(|s| s.success());
    assert!(made, "writing the PDFs");
    let rel = lay_out(dir.path(), "pdftools", "");
    let extra =
        "[[items]]\nargument = \"path\"\nnames_path = true\n[[items]]\nargument = \"directory\"\nnames_path = true\n";
    let path = |n: &str| data.join(n).to_string_lossy().into_owned();
    let calls = vec![
        ("read_local_pdf".to_owned(), json!({"path": path("report.pdf")})),
        ("read_local_pdf".to_owned(), json!({"path": path("memo.pdf")})),
        ("read_local_pdf".to_owned(), json!({"path": path("broken.pdf")})),
        ("list_pdf_files".to_owned(), json!({"directory": data.to_string_lossy()})),
    ];
    let results = compare(&rel, policy(&data, extra), &dir.path().join("home"), &calls, Some("projx"), |_, v| v);
    assert!(results[0].to_string().contains("Region totals"), "the text was extracted: {}", results[0]);
}
