//! `oncebox new NAME --class CLASS [--lang rust|python|js] [--path DIR] [--sdk PATH]`: writes a
//! tool's project outside any workspace that builds to a component with one command (`cargo
//! build`, `python -m oncebox_tool build`, `npm run build`): the tool (and its reconcile where the
//! class needs one), a policy file, and a harness test (a script for `oncebox test`). The three
//! languages' tools do the same thing, so the policy file and the harness script are shared.

use std::path::{Path, PathBuf};

use super::{Exit, Usage};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Class {
    ReadOnly,
    IdempotentWrite,
    Compensatable,
    Irreversible,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tool's name: its crate, its component and its manifest name.
    pub name: String,
    /// Its replay class, as in the WIT.
    #[arg(long, value_enum)]
    pub class: Class,
    /// The language the tool is written in.
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: Lang,
    /// Where the project's directory is made (default: here).
    #[arg(long, default_value = ".")]
    pub path: PathBuf,
    /// The SDK to depend on, as a path: `guest-sdk` (Rust), `guest-sdk/python` or `guest-sdk/js`
    /// (default: the SDK of the checkout this binary was built from).
    #[arg(long)]
    pub sdk: Option<PathBuf>,
}

/// The SDKs beside the host crate this binary was built from.
const BUILT_FROM_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../guest-sdk");

pub async fn run(args: Args) -> anyhow::Result<Exit> {
    valid_name(&args.name)?;
    let sdk = args.sdk.clone().unwrap_or_else(|| {
        let built_from = PathBuf::from(BUILT_FROM_SDK);
        match args.lang {
            Lang::Rust => built_from,
            Lang::Python => built_from.join("python"),
            Lang::Js => built_from.join("js"),
        }
    });
    let sdk = sdk.canonicalize().map_err(|e| {
        Usage(format!("the SDK at {} is not there ({e}); say where it is with --sdk PATH", sdk.display()))
    })?;
    let dir = args.path.join(&args.name);
    if dir.exists() {
        return Err(Usage(format!("{} exists already; nothing was written", dir.display())).into());
    }
    for (file, text) in files(&args.name, args.class, args.lang, &sdk) {
        let path = dir.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text)?;
    }
    println!("created {} ({} tool, {})", dir.display(), class_name(args.class), lang_name(args.lang));
    println!("next:");
    println!("  cd {}", dir.display());
    let wasm = match args.lang {
        Lang::Rust => {
            println!("  cargo build --release");
            format!("target/wasm32-wasip2/release/{}.wasm", args.name.replace('-', "_"))
        }
        Lang::Python => {
            println!("  python3 -m venv .venv");
            println!("  .venv/bin/pip install {}", sdk.display());
            println!("  .venv/bin/python -m oncebox_tool build");
            format!("{}.wasm", args.name)
        }
        Lang::Js => {
            println!("  npm install");
            println!("  npm run build");
            format!("{}.wasm", args.name)
        }
    };
    println!(
        "  oncebox test {wasm} --policy oncebox.toml --script harness.toml --args '{}' --explore",
        args_of(args.class)
    );
    Ok(Exit::Ok)
}

fn lang_name(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
    }
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

/// A Python tool's module is `app.py` whatever the tool's name: a module named after the tool
/// (`types`, `json`, `queue`) would hide a standard-library module inside the component.
const PYTHON_MODULE: &str = "app.py";

/// Every file of the project, by its path in it.
fn files(name: &str, class: Class, lang: Lang, sdk: &Path) -> Vec<(&'static str, String)> {
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
            .replace("{{class}}", class_name(class))
            .replace("{{sdk}}", &sdk.display().to_string())
            .replace("{{args}}", args_of(class))
    };
    let script = match class {
        Class::ReadOnly => include_str!("new/harness_read.toml"),
        _ => include_str!("new/harness_write.toml"),
    };
    let shared = [("oncebox.toml", fill(include_str!("new/oncebox.toml"))), ("harness.toml", fill(script))];
    let own = match lang {
        Lang::Rust => {
            let tool = match class {
                Class::ReadOnly => include_str!("new/read_only.rs.txt"),
                Class::IdempotentWrite => include_str!("new/idempotent_write.rs.txt"),
                Class::Compensatable => include_str!("new/compensatable.rs.txt"),
                Class::Irreversible => include_str!("new/irreversible.rs.txt"),
            };
            vec![
                ("Cargo.toml", fill(include_str!("new/Cargo.toml.txt"))),
                (".cargo/config.toml", include_str!("new/config.toml").to_string()),
                (".gitignore", "/target\n".to_string()),
                ("src/lib.rs", fill(tool)),
                ("README.md", fill(include_str!("new/README.md"))),
            ]
        }
        Lang::Python => {
            let tool = match class {
                Class::ReadOnly => include_str!("new/python/read_only.py.txt"),
                Class::IdempotentWrite => include_str!("new/python/idempotent_write.py.txt"),
                Class::Compensatable => include_str!("new/python/compensatable.py.txt"),
                Class::Irreversible => include_str!("new/python/irreversible.py.txt"),
            };
            vec![
                ("pyproject.toml", fill(include_str!("new/python/pyproject.toml.txt"))),
                (".gitignore", fill(include_str!("new/python/gitignore.txt"))),
                (PYTHON_MODULE, fill(tool)),
                ("README.md", fill(include_str!("new/python/README.md"))),
            ]
        }
        Lang::Js => {
            let tool = match class {
                Class::ReadOnly => include_str!("new/js/read_only.js.txt"),
                Class::IdempotentWrite => include_str!("new/js/idempotent_write.js.txt"),
                Class::Compensatable => include_str!("new/js/compensatable.js.txt"),
                Class::Irreversible => include_str!("new/js/irreversible.js.txt"),
            };
            vec![
                ("package.json", fill(include_str!("new/js/package.json.txt"))),
                (".gitignore", fill(include_str!("new/js/gitignore.txt"))),
                (".npmrc", fill(include_str!("new/js/npmrc.txt"))),
                ("tool.js", fill(tool)),
                ("README.md", fill(include_str!("new/js/README.md"))),
            ]
        }
    };
    own.into_iter().chain(shared).collect()
}
