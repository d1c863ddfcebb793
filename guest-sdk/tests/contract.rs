//! The contract has one source, `wit/` at the repository's root. The SDK carries a copy in
//! `guest-sdk/wit` so that a path, git or published dependency on the SDK alone builds with no
//! other file; this test keeps the copy byte-identical (refresh it with `cp wit/*.wit guest-sdk/wit/`).

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

#[test]
fn the_sdk_carries_the_contract_byte_identical() {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = wit_files(&sdk.join("../wit"));
    let copy = wit_files(&sdk.join("wit"));
    assert!(!root.is_empty(), "no contract in wit/");
    let names = |files: &BTreeMap<String, Vec<u8>>| files.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&copy),
        names(&root),
        "guest-sdk/wit must hold exactly the files of wit/: cp wit/*.wit guest-sdk/wit/"
    );
    for (name, bytes) in &root {
        assert!(copy[name] == *bytes, "guest-sdk/wit/{name} differs from wit/{name}: cp wit/*.wit guest-sdk/wit/");
    }
}
