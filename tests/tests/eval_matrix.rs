//! Issue 7 acceptance in CI: the attack matrix (one trial per cell) and the existence-bit
//! test, with their result files written under the target directory. A regression in any
//! runtime's expected row fails the build, and so does an attack variant without its
//! control (no disclosure under sig-pin) or a cell that errored instead of running.

use germline_executor::runtime::RuntimeKind;
use germline_tests::eval::{run_existence_bit, run_matrix, Matrix, MatrixOptions};
use germline_tests::world::python;

fn out_dir() -> std::path::PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("eval");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn disclosing(m: &Matrix, variant: &str, runtime: &str) -> usize {
    m.cell(variant, runtime).unwrap_or_else(|| panic!("no cell {variant}/{runtime}")).disclosing
}

#[test]
fn eval_matrix_meets_the_expectations() {
    let home = tempfile::tempdir().unwrap();
    let trials = std::env::var("GERMLINE_EVAL_TRIALS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let m = run_matrix(&MatrixOptions { trials, runtimes: vec![], variants: vec![] }, &python(home.path())).unwrap();
    let dir = out_dir();
    std::fs::write(dir.join("matrix.json"), serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    std::fs::write(dir.join("matrix.svg"), m.render_svg()).unwrap();
    println!("{}", m.render_text());
    let attacks: Vec<&String> = m.variants.iter().filter(|v| *v != "benign").collect();
    assert!(m.no_control.is_empty(), "NO CONTROL: {:?} do not disclose under sig-pin", m.no_control);
    for kind in RuntimeKind::ALL {
        assert_eq!(m.errors(kind.name()), 0, "{}: error cells are not results", kind.name());
    }
    for kind in RuntimeKind::ALL {
        let r = kind.name();
        let benign = m.cell("benign", r).unwrap();
        assert_eq!(benign.steps_completed, benign.steps, "{r}: every benign step completes");
        assert_eq!(benign.disclosing, 0, "{r}: the benign release discloses nothing: {:?}", benign.examples);
    }
    for v in &attacks {
        let c = m.cell(v, "germline").unwrap();
        assert_eq!(c.disclosing, 0, "germline discloses on {v}: {:?}", c.examples);
        assert!(c.stopped(), "germline's {v} cell ran and was judged: {c:?}");
    }
    for r in ["sig-pin", "sig-ifc"] {
        let n = attacks.iter().filter(|v| disclosing(&m, v, r) > 0).count();
        assert!(n * 4 >= attacks.len() * 3, "{r} discloses on most variants ({n}/{})", attacks.len());
    }
    for v in ["direct", "filesteal", "init-read", "redirect"] {
        assert_eq!(disclosing(&m, v, "confined-ifc"), 0, "confined-ifc stops {v}");
    }
    for v in ["pool", "smuggle", "launder", "launder-text", "dormant", "trigger", "evasive", "capsule", "dep", "xtool"]
    {
        assert!(disclosing(&m, v, "confined-ifc") > 0, "confined-ifc does not stop {v}");
    }
    for v in ["smuggle", "trigger", "evasive", "existence-bit"] {
        assert!(disclosing(&m, v, "fresh-ifc") > 0, "fresh-ifc still discloses within-call mixing ({v})");
        assert!(disclosing(&m, v, "nosplit") > 0, "nosplit still discloses within-call mixing ({v})");
    }
}

#[test]
fn existence_bit_lazy_leaks_every_bit_declared_leaks_none_and_trips() {
    let home = tempfile::tempdir().unwrap();
    let r = run_existence_bit(&python(home.path())).unwrap();
    std::fs::write(out_dir().join("existence-bit.json"), serde_json::to_vec_pretty(&r).unwrap()).unwrap();
    println!("{}", r.render_text());
    let lazy = &r.modes[0];
    let declared = &r.modes[1];
    assert_eq!(lazy.correct, 64, "lazy splitting hands the host every bit: {lazy:?}");
    assert!(declared.constant, "declared splitting shows the host a constant pattern: {declared:?}");
    assert!(declared.correct <= declared.constant_guess, "{declared:?}");
    assert_eq!(declared.triggers_on_attempts, declared.secret_dependent_attempts, "{declared:?}");
    assert_eq!(declared.triggers_otherwise, 0, "{declared:?}");
}
