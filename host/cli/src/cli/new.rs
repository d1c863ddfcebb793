//! `oncebox new NAME --class CLASS [--path DIR] [--sdk PATH]`: writes a tool crate outside any
//! workspace that builds to a component with one `cargo build`: the tool (and its reconcile where
//! the class needs one), a policy file, and a harness test (a script for `oncebox test`).

use std::path::{Path, PathBuf};

use super::{Exit, Usage};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Class {
    ReadOnly,
    IdempotentWrite,
    Compensatable,
    Irreversible,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tool's name: its crate, its component and its manifest name.
    pub name: String,
    /// Its replay class, as in the WIT.
    #[arg(long, value_enum)]
    pub class: Class,
    /// Where the crate's directory is made (default: here).
    #[arg(long, default_value = ".")]
    pub path: PathBuf,
    /// The oncebox-sdk crate to depend on, as a path (default: the SDK of the checkout this
    /// binary was built from).
    #[arg(long)]
    pub sdk: Option<PathBuf>,
}

/// The SDK beside the host crate this binary was built from.
const BUILT_FROM_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../guest-sdk");

pub async fn run(args: Args) -> anyhow::Result<Exit> {
    valid_name(&args.name)?;
    let sdk = args.sdk.clone().unwrap_or_else(|| PathBuf::from(BUILT_FROM_SDK));
    let sdk = sdk.canonicalize().map_err(|e| {
        Usage(format!("the SDK at {} is not there ({e}); say where it is with --sdk PATH/TO/guest-sdk", sdk.display()))
    })?;
    let dir = args.path.join(&args.name);
    if dir.exists() {
        return Err(Usage(format!("{} exists already; nothing was written", dir.display())).into());
    }
    for (file, text) in files(&args.name, args.class, &sdk) {
        let path = dir.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text)?;
    }
    let wasm = format!("target/wasm32-wasip2/release/{}.wasm", args.name.replace('-', "_"));
    println!("created {} ({} tool)", dir.display(), class_name(args.class));
    println!("next:");
    println!("  cd {}", dir.display());
    println!("  cargo build --release");
    println!(
        "  oncebox test {wasm} --policy oncebox.toml --script harness.toml --args '{}' --explore",
        args_of(args.class)
    );
    Ok(Exit::Ok)
}

fn valid_name(name: &str) -> Result<(), Usage> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Usage(format!("`{name}`: a tool's name is lowercase letters, digits and dashes, starting with a letter")))
    }
}

fn class_name(class: Class) -> &'static str {
    match class {
        Class::ReadOnly => "read-only",
        Class::IdempotentWrite => "idempotent-write",
        Class::Compensatable => "compensatable",
        Class::Irreversible => "irreversible",
    }
}

/// The args the scaffold's tool takes, for the printed command and its harness test.
fn args_of(class: Class) -> &'static str {
    match class {
        Class::ReadOnly => r#"{"id":"item-1"}"#,
        _ => r#"{"id":"item-1","quantity":2}"#,
    }
}

/// Every file of the crate, by its path in it.
fn files(name: &str, class: Class, sdk: &Path) -> Vec<(&'static str, String)> {
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
            .replace("{{class}}", class_name(class))
            .replace("{{sdk}}", &sdk.display().to_string())
            .replace("{{args}}", args_of(class))
    };
    let tool = match class {
        Class::ReadOnly => include_str!("new/read_only.rs.txt"),
        Class::IdempotentWrite => include_str!("new/idempotent_write.rs.txt"),
        Class::Compensatable => include_str!("new/compensatable.rs.txt"),
        Class::Irreversible => include_str!("new/irreversible.rs.txt"),
    };
    let script = match class {
        Class::ReadOnly => include_str!("new/harness_read.toml"),
        _ => include_str!("new/harness_write.toml"),
    };
    vec![
        ("Cargo.toml", fill(include_str!("new/Cargo.toml.txt"))),
        (".cargo/config.toml", include_str!("new/config.toml").to_string()),
        (".gitignore", "/target\n".to_string()),
        ("src/lib.rs", fill(tool)),
        ("oncebox.toml", fill(include_str!("new/oncebox.toml"))),
        ("harness.toml", fill(script)),
        ("README.md", fill(include_str!("new/README.md"))),
    ]
}
