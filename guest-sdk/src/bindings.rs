//! The contract's imports, bound once for every tool. Exports are bound per class by `export!`.
#![allow(missing_docs, clippy::all, unsafe_code)]

wit_bindgen::generate!({
    path: "wit",
    world: "oncebox:tool/guest-imports@0.1.0",
    pub_export_macro: false,
});
