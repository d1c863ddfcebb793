//! `export!(Tool, class = ...)`: the one macro a tool author writes.
//!
//! A component must export exactly what the world of its replay class exports (a read-only tool has
//! no `reconcile`), so the export glue cannot be generated once in `oncebox-sdk`: it is generated
//! here, in the tool's crate, for the class the author names. The imports stay bound once in the
//! SDK (through wit-bindgen's `with`), so a tool's effect calls are plain `oncebox_sdk` functions.
//! This crate has no dependencies: it only writes tokens.
//!
//! The contract travels with the SDK: its WIT files (`guest-sdk/wit`, the SDK's copy of the root
//! `wit/`, checked byte-identical by `guest-sdk/tests/contract.rs`; reached from here through the
//! `wit` link beside this crate's manifest, which `cargo package` follows) are compiled into this
//! macro as text, and `export!` hands that text to wit-bindgen inline. Nothing the tool's build
//! sees names a path on the machine that built the SDK, so the SDK works as a path, git, vendored
//! or published dependency alike.

use proc_macro::{TokenStream, TokenTree};

/// The contract's files: one package, so their order does not matter.
const WIT_FILES: [&str; 5] = [
    include_str!("../wit/types.wit"),
    include_str!("../wit/reads.wit"),
    include_str!("../wit/effects.wit"),
    include_str!("../wit/tool.wit"),
    include_str!("../wit/worlds.wit"),
];

/// The contract as one WIT document: every file's `package` line but the first dropped, since an
/// inline document declares its package once.
fn wit_document() -> String {
    let mut document = String::new();
    let mut declared = false;
    for file in WIT_FILES {
        for line in file.lines() {
            if line.trim_start().starts_with("package ") {
                if declared {
                    continue;
                }
                declared = true;
            }
            document.push_str(line);
            document.push('\n');
        }
    }
    document
}

struct Class {
    keyword: &'static str,
    world: &'static str,
    variant: &'static str,
    reconciles: bool,
}

const CLASSES: [Class; 4] = [
    Class { keyword: "read_only", world: "read-only-tool", variant: "ReadOnly", reconciles: false },
    Class { keyword: "idempotent_write", world: "idempotent-tool", variant: "IdempotentWrite", reconciles: false },
    Class { keyword: "compensatable", world: "compensatable-tool", variant: "Compensatable", reconciles: true },
    Class { keyword: "irreversible", world: "irreversible-tool", variant: "Irreversible", reconciles: true },
];

/// Exports a tool as a component of its class's world.
///
/// ```ignore
/// oncebox_sdk::export!(Charge, class = compensatable);
/// ```
///
/// `class` is one of `read_only`, `idempotent_write`, `compensatable`, `irreversible`. The last two
/// also require `impl oncebox_sdk::Reconcile for Charge`.
///
/// The exports are emitted only when the crate is built for `wasm32`: built for the host target
/// (a `cargo build --workspace` that includes the tool crate), it type-checks and links, exporting
/// nothing.
#[proc_macro]
pub fn export(input: TokenStream) -> TokenStream {
    match expand(input) {
        Ok(tokens) => tokens,
        Err(message) => compile_error(&message),
    }
}

fn expand(input: TokenStream) -> Result<TokenStream, String> {
    let usage =
        "usage: oncebox_sdk::export!(MyTool, class = read_only | idempotent_write | compensatable | irreversible)";
    let tokens: Vec<TokenTree> = input.into_iter().collect();
    let comma = tokens.iter().position(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ',')).ok_or(usage)?;
    let ty: String = tokens[..comma].iter().map(ToString::to_string).collect();
    let rest: Vec<String> = tokens[comma + 1..].iter().map(ToString::to_string).collect();
    let keyword = match rest.as_slice() {
        [key, eq, class] if key == "class" && eq == "=" => class.as_str(),
        _ => return Err(usage.to_string()),
    };
    let class = CLASSES
        .iter()
        .find(|c| c.keyword == keyword)
        .ok_or_else(|| format!("unknown replay class `{keyword}`; {usage}"))?;
    if ty.is_empty() {
        return Err(usage.to_string());
    }

    let reconcile_impl = if class.reconciles {
        format!(
            "impl exports::oncebox::tool::reconcile::Guest for __OnceboxExport {{
                fn reconcile(effect_key: String, args: String)
                    -> exports::oncebox::tool::reconcile::Reconciliation {{
                    use exports::oncebox::tool::reconcile::Reconciliation as R;
                    match ::oncebox_sdk::__private::reconcile::<{ty}>(&effect_key, &args) {{
                        ::oncebox_sdk::__private::Reconciled::Committed(output) => R::Committed(output),
                        ::oncebox_sdk::__private::Reconciled::NotCommitted => R::NotCommitted,
                        ::oncebox_sdk::__private::Reconciled::StillUnknown => R::StillUnknown,
                    }}
                }}
            }}"
        )
    } else {
        String::new()
    };

    // The contract as a Rust string literal, for wit-bindgen's `inline`.
    let wit_literal = format!("{:?}", wit_document());
    let code = format!(
        r#"
        #[doc(hidden)]
        #[allow(clippy::all, unsafe_code, missing_docs)]
        #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
        mod __oncebox_export {{
            use super::*;
            ::oncebox_sdk::__private::wit_bindgen::generate!({{
                inline: {wit},
                world: "oncebox:tool/{world}@0.1.0",
                with: {{
                    "oncebox:tool/types@0.1.0": ::oncebox_sdk::__private::bindings::oncebox::tool::types,
                    "oncebox:tool/reads@0.1.0": ::oncebox_sdk::__private::bindings::oncebox::tool::reads,
                    "oncebox:tool/config@0.1.0": ::oncebox_sdk::__private::bindings::oncebox::tool::config,
                    {effects_with}
                }},
                runtime_path: "::oncebox_sdk::__private::wit_bindgen::rt",
            }});

            struct __OnceboxExport;

            impl exports::oncebox::tool::tool::Guest for __OnceboxExport {{
                fn describe() -> ::oncebox_sdk::__private::Manifest {{
                    ::oncebox_sdk::__private::manifest::<{ty}>(
                        ::oncebox_sdk::ReplayClass::{variant},
                        env!("CARGO_PKG_VERSION"),
                    )
                }}
                fn invoke(args: String) -> Result<String, ::oncebox_sdk::ToolError> {{
                    ::oncebox_sdk::__private::invoke::<{ty}>(&args)
                }}
            }}

            {reconcile_impl}

            // The component's exports exist only in a component: built for the host (a workspace's
            // `cargo build`, clippy, doc or test), the crate still type-checks its impls against
            // the contract but exports nothing, since a host linker's version script cannot parse
            // names such as `cabi_post_oncebox:tool/tool@0.1.0#describe`.
            #[cfg(target_arch = "wasm32")]
            export!(__OnceboxExport);
        }}
        "#,
        wit = wit_literal,
        world = class.world,
        variant = class.variant,
        effects_with = if class.keyword == "read_only" {
            ""
        } else {
            r#""oncebox:tool/effects@0.1.0": ::oncebox_sdk::__private::bindings::oncebox::tool::effects,"#
        },
    );
    code.parse().map_err(|e| format!("oncebox_sdk::export!: internal expansion error: {e}"))
}

fn compile_error(message: &str) -> TokenStream {
    format!("compile_error!({message:?});").parse().unwrap_or_default()
}
