//! Shared helpers for admission's integration tests.
#![allow(dead_code)]

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use germline_admission::{build_release_archive, BuildOptions, BuiltRelease};

/// Writes a minimal Python release directory.
pub fn sample_release(dir: &Path, version: &str) {
    fs::create_dir_all(dir.join("src/notes_server")).expect("mkdir");
    fs::write(
        dir.join("germline.toml"),
        format!(
            "[release]\nname = \"notes\"\nversion = \"{version}\"\nruntime = \"python\"\nfactory = \"notes_server:create_server\"\npython_path = [\"src\"]\n"
        ),
    )
    .expect("manifest");
    fs::write(dir.join("src/notes_server/__init__.py"), "def create_server():\n    return None\n").expect("code");
}

/// Builds `notes@version` into `<tmp>/notes-<version>.tar.gz`.
pub fn built_release(tmp: &Path, version: &str) -> (PathBuf, BuiltRelease) {
    let dir = tmp.join(format!("src-{version}"));
    sample_release(&dir, version);
    let out = tmp.join(format!("notes-{version}.tar.gz"));
    let built = build_release_archive(&dir, &out, &BuildOptions::default()).expect("build");
    (out, built)
}

/// Serves `root` over HTTP/1.0 on a loopback port, for at most `max_requests`
/// requests; returns the base URL.
pub fn serve_dir(root: PathBuf, max_requests: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().take(max_requests) {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).map(|n| n == 0).unwrap_or(true) || h == "\r\n" {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_owned();
            let file = root.join(&path);
            let resp = if !path.contains("..") && file.is_file() {
                let body = fs::read(&file).unwrap_or_default();
                let mut r = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())
                    .into_bytes();
                r.extend(body);
                r
            } else {
                b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
            };
            let _ = stream.write_all(&resp);
        }
    });
    format!("http://{addr}")
}

/// The Python for interop tests, or `None` (with the reason printed) when it lacks
/// `module`. Under CI (`CI=true`) a missing Python fails the test instead.
pub fn python_with(module: &str) -> Option<PathBuf> {
    let python = germline_admission::archive::default_python();
    let ok = std::process::Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        return Some(python);
    }
    let msg = format!(
        "{} cannot import {module}: set GERMLINE_PYTHON to a venv with scripts/requirements.txt",
        python.display()
    );
    skip_or_fail(&msg);
    None
}

/// A missing prerequisite fails the test, unless `GERMLINE_ALLOW_SKIP` is set (to `all`
/// or a list naming `admission`) and the run is not CI (`CI=true`): then it says why and
/// returns, and the caller skips. A test never skips silently, and never in CI.
pub fn skip_or_fail(msg: &str) {
    let allowed = std::env::var("GERMLINE_ALLOW_SKIP")
        .is_ok_and(|v| v.split(',').map(str::trim).any(|n| n == "admission" || n == "all"));
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !allowed || ci {
        panic!("{msg} (set GERMLINE_ALLOW_SKIP=admission outside CI to skip)");
    }
    eprintln!("SKIPPED (allowed by GERMLINE_ALLOW_SKIP): {msg}");
}
