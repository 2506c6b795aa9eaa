//! Issue 12 point 1: a file carries the label of the file that is read, whatever string
//! names it. Each way of naming the hr payslip through the finance tree (`..`, `//`, `/./`,
//! a symlinked directory, a `names_path` argument) is planned as hr, so the
//! finance-cleared OCR host receives nothing; the raw-string twin (paths labelled as
//! given) shows the same request delivering the payslip.

use std::path::{Path, PathBuf};

use germline_executor::policy::Policy;
use germline_executor::runtime::RuntimeKind;
use germline_tests::oracle::Oracle;
use germline_tests::sink::{Sink, SinkBehaviour};
use germline_tests::world::{label_tags, request, World};
use serde_json::json;

const RELEASE: &str = r#"
def _files(root):
    out = []
    for d, _, names in os.walk(root, followlinks=True):
        for n in sorted(names):
            out.append(os.path.join(d, n))
    return out

def create_server():
    m = FastMCP("ocr")
    @m.tool()
    def scan(document: str) -> str:
        try:
            text = open(document).read()
        except OSError as e:
            return "unreadable: " + e.__class__.__name__
        status, _ = post("http://ocr.example/scan", text)
        return "ocr %d" % status
    @m.tool()
    def scan_repo(repo: str) -> str:
        texts = []
        for f in _files(repo):
            try:
                texts.append(open(f).read())
            except OSError:
                pass
        status, _ = post("http://ocr.example/scan", "\n".join(texts))
        return "ocr %d (%d files)" % (status, len(texts))
    return m
"#;

struct Case {
    world: World,
    oracle: Oracle,
    release: PathBuf,
    hr_canary: String,
}

fn case() -> Case {
    let world = World::new();
    let mut oracle = Oracle::new();
    let hr = oracle.plant(&["hr"]);
    let fin = oracle.plant(&["finance"]);
    world.item("hr", "payslip.txt", &format!("payslip {}", hr.as_str()));
    world.item("finance", "invoice.txt", &format!("invoice {}", fin.as_str()));
    std::os::unix::fs::symlink(world.data.join("hr"), world.data.join("finance").join("link")).expect("symlink");
    let release = world.release(
        "ocr",
        "[tools.scan]\nhosts = [\"ocr.example\"]\n[tools.scan_repo]\nhosts = [\"ocr.example\"]\n",
        RELEASE,
    );
    let hr_canary = hr.as_str().to_owned();
    Case { world, oracle, release, hr_canary }
}

fn policy(c: &Case, sink: &Sink) -> Policy {
    c.world.policy(
        &[("ocr.example", &["finance"], Some(sink.addr()))],
        &[("agent", &["hr", "board", "finance", "projx", "public"])],
        "[[items]]\nargument = \"repo\"\nnames_path = true\n",
    )
}

/// Ways of naming the hr payslip (or the hr tree) that start in the finance tree.
fn aliases(data: &Path) -> Vec<(&'static str, &'static str, serde_json::Value, bool)> {
    let d = data.display();
    vec![
        ("dot-dot", "scan", json!({"document": format!("{d}/finance/../hr/payslip.txt")}), true),
        ("double-slash", "scan", json!({"document": format!("{d}/finance//..//hr/payslip.txt")}), true),
        ("dot", "scan", json!({"document": format!("{d}/finance/./../hr/./payslip.txt")}), true),
        ("symlinked-dir", "scan", json!({"document": format!("{d}/finance/link/payslip.txt")}), true),
        ("names_path", "scan_repo", json!({"repo": format!("{d}/finance/../hr")}), false),
    ]
}

/// Runs every alias under germline with `policy`; returns the aliases whose hr canary
/// reached the finance-cleared sink.
fn leaks(c: &Case, raw: bool) -> Vec<&'static str> {
    let sink = Sink::start(SinkBehaviour::default());
    let mut p = policy(c, &sink);
    if raw {
        p = p.label_raw_paths_for_tests();
    }
    let mut rt = c.world.start(RuntimeKind::Germline, &c.release, p).expect("germline starts");
    let mut out = Vec::new();
    for (name, tool, args, as_item) in aliases(&c.world.data) {
        let before = sink.received().len();
        let item = PathBuf::from(args["document"].as_str().unwrap_or_default());
        let items: Vec<&Path> = if as_item { vec![item.as_path()] } else { vec![] };
        let outcome = rt.call(&request(tool, args.clone(), &items));
        let got = sink.received();
        let fresh = &got[before..];
        let finance_clearance = vec!["finance".to_owned()];
        let seen = !c.oracle.disclosures("ocr.example", &finance_clearance, fresh).is_empty();
        if !raw {
            // The true label is on the answer whenever the call read the payslip.
            if let Some(tags) = label_tags(&outcome) {
                if outcome.error.is_none() {
                    assert!(tags.contains(&"hr".to_owned()), "{name}: answer labelled {tags:?}, not hr");
                }
            }
        }
        assert!(
            !fresh.windows(c.hr_canary.len()).any(|w| w == c.hr_canary.as_bytes()) || seen,
            "oracle and raw search agree"
        );
        if seen {
            out.push(name);
        }
    }
    out
}

#[test]
fn every_alias_of_an_hr_file_through_the_finance_tree_is_labelled_hr() {
    let c = case();
    let off = leaks(&c, true);
    assert_eq!(
        off,
        vec!["dot-dot", "double-slash", "dot", "symlinked-dir", "names_path"],
        "mechanism off: each alias delivers the payslip to the finance-cleared host"
    );
    let on = leaks(&c, false);
    assert!(on.is_empty(), "canonical names: nothing reaches the finance-cleared host, got {on:?}");
}

#[test]
fn relative_and_missing_paths_are_refused_with_the_path_named() {
    let c = case();
    let sink = Sink::start(SinkBehaviour::default());
    let mut rt = c.world.start(RuntimeKind::Germline, &c.release, policy(&c, &sink)).expect("germline starts");
    let rel = rt.call(&request("scan", json!({"document": "x"}), &[Path::new("finance/invoice.txt")]));
    assert!(rel.error.as_deref().unwrap_or("").contains("must be absolute"), "{:?}", rel.error);
    let repo = rt.call(&request("scan_repo", json!({"repo": "finance"}), &[]));
    assert!(repo.error.as_deref().unwrap_or("").contains("relative path"), "{:?}", repo.error);
    let missing = c.world.data.join("finance/../hr/none.txt");
    let m = rt.call(&request("scan", json!({"document": "x"}), &[missing.as_path()]));
    assert!(m.error.as_deref().unwrap_or("").contains("none.txt"), "{:?}", m.error);
    assert_eq!(sink.request_count(), 0);
}
