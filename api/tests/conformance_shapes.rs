//! The command shapes the TUF and Sigstore conformance suites drive: exit 0 on success,
//! 1 on any verification failure, trusted metadata stored as `D/root.json`.

use std::path::Path;
use std::process::Command;

fn germline(args: &[&str], cwd: &Path) -> i32 {
    let out = Command::new(env!("CARGO_BIN_EXE_germline"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    out.status.code().unwrap_or(-1)
}

#[test]
fn tuf_client_and_verify_bundle_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    assert_eq!(germline(&["repo", "init", "repo", "--keys", "keys"], d), 0);
    assert_eq!(germline(&["tuf-client", "--metadata-dir", "md", "init", "repo/metadata/1.root.json"], d), 0);
    assert!(d.join("md/root.json").is_file(), "trusted root stored as D/root.json");
    std::fs::write(d.join("bad-root.json"), "{\"signed\": {}, \"signatures\": []}").unwrap();
    assert_eq!(germline(&["tuf-client", "--metadata-dir", "md2", "init", "bad-root.json"], d), 1);
    // A refresh against a repository that is not there is a failure, not a crash.
    let url = format!("file://{}/nowhere/", d.display());
    assert_eq!(germline(&["tuf-client", "--metadata-dir", "md", "--metadata-url", &url, "refresh"], d), 1);
    std::fs::write(d.join("artifact"), "bytes").unwrap();
    std::fs::write(d.join("bundle.json"), "{\"mediaType\": \"application/vnd.dev.sigstore.bundle+json;version=0.3\"}")
        .unwrap();
    std::fs::write(d.join("key.pub"), "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n").unwrap();
    assert_eq!(
        germline(&["sigstore", "verify-bundle", "--bundle", "bundle.json", "--key", "key.pub", "artifact"], d),
        1
    );
    assert_eq!(
        germline(
            &[
                "sigstore",
                "verify-bundle",
                "--bundle",
                "bundle.json",
                "--certificate-identity",
                "a@example.com",
                "--certificate-oidc-issuer",
                "https://issuer.example",
                "artifact"
            ],
            d
        ),
        1
    );
}
