//! Tidy checks over the workspace's own sources: every Rust file opens with a `//!` line
//! saying what it is for, and no test is ignored or marked should-panic.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in
        std::fs::read_dir(dir).unwrap_or_else(|err| panic!("read {}: {err}", dir.display()))
    {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if name == "target" || name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for krate in ["protocol", "agentctl", "supervisor", "agents", "tests"] {
        rust_files(&workspace_root().join(krate), &mut files);
    }
    assert!(files.len() > 10, "the walk found too few files: {files:?}");
    files
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let missing: Vec<_> = sources()
        .into_iter()
        .filter(|path| !std::fs::read_to_string(path).expect("a source file").starts_with("//! "))
        .collect();
    assert!(missing.is_empty(), "files without a leading //! doc line: {missing:#?}");
}

#[test]
fn no_ignored_or_should_panic_tests() {
    let banned = [concat!("#[", "ignore"), concat!("#[", "should_panic")];
    let offenders: Vec<_> = sources()
        .into_iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).expect("a source file");
            banned.iter().any(|attr| text.contains(attr))
        })
        .collect();
    assert!(offenders.is_empty(), "assert Err/None explicitly instead: {offenders:#?}");
}
