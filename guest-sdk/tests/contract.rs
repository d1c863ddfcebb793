//! The contract has one source, `wit/` at the repository's root. Each SDK carries a copy, so that a
//! path, git or published dependency on the SDK alone builds with no other file: the Rust crate in
//! `guest-sdk/wit`, the Python package in `guest-sdk/python/oncebox_tool/wit`, the npm package in
//! `guest-sdk/js/wit`. This test keeps every copy byte-identical (refresh them with the `cp` it
//! prints).

use std::collections::BTreeMap;
use std::path::Path;

fn wit_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    entries
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wit"))
        .map(|path| {
            let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (name, bytes)
        })
        .collect()
}

/// Each SDK's copy, relative to this crate's directory.
const COPIES: [&str; 3] = ["wit", "python/oncebox_tool/wit", "js/wit"];

#[test]
fn every_sdk_carries_the_contract_byte_identical() {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = wit_files(&sdk.join("../wit"));
    assert!(!root.is_empty(), "no contract in wit/");
    let names = |files: &BTreeMap<String, Vec<u8>>| files.keys().cloned().collect::<Vec<_>>();
    for dir in COPIES {
        let copy = wit_files(&sdk.join(dir));
        let fix = format!("cp wit/*.wit guest-sdk/{dir}/");
        assert_eq!(names(&copy), names(&root), "guest-sdk/{dir} must hold exactly the files of wit/: {fix}");
        for (name, bytes) in &root {
            assert!(copy[name] == *bytes, "guest-sdk/{dir}/{name} differs from wit/{name}: {fix}");
        }
    }
}
