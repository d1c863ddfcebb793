//! Where a ledger lives: a redb file owned by one process, or a PostgreSQL database that many
//! hosts share. Parsed from what an operator types after `--ledger`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::postgres::without_password;
use super::{Ledger, LedgerError};

/// A ledger's location: `postgres://…` (or `postgresql://…`, or libpq's `host=… dbname=…`)
/// names a database, anything else a redb file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerAt {
    File(PathBuf),
    /// A libpq-style URL (`postgres://user:password@host:port/database?options`).
    Postgres(String),
}

impl LedgerAt {
    /// Whether other hosts may use this ledger at the same time: they then need one key file
    /// between them (a fingerprint computed under another key would never match).
    pub fn is_shared(&self) -> bool {
        matches!(self, LedgerAt::Postgres(_))
    }

    /// The file, for a file ledger.
    pub fn file(&self) -> Option<&Path> {
        match self {
            LedgerAt::File(path) => Some(path),
            LedgerAt::Postgres(_) => None,
        }
    }

    /// Opens the ledger: a file is created if missing and recovered ([`Ledger::open`]); a
    /// database gets its schema on first use ([`Ledger::connect`]).
    pub async fn open(&self) -> Result<Ledger, LedgerError> {
        match self {
            LedgerAt::File(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || Ledger::open(path))
                    .await
                    .map_err(|e| LedgerError::Corrupt { what: format!("opening the ledger panicked: {e}") })?
            }
            LedgerAt::Postgres(url) => Ledger::connect(url).await,
        }
    }
}

impl FromStr for LedgerAt {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // A URL, or libpq key/value pairs the driver reads (`host=db dbname=ob`); a path never
        // parses as those (a word without `=`, or an option the driver does not know).
        let pairs = text.contains('=') && text.parse::<tokio_postgres::Config>().is_ok();
        Ok(if text.starts_with("postgres://") || text.starts_with("postgresql://") || pairs {
            LedgerAt::Postgres(text.to_string())
        } else {
            LedgerAt::File(PathBuf::from(text))
        })
    }
}

impl From<&Path> for LedgerAt {
    fn from(path: &Path) -> Self {
        LedgerAt::File(path.to_path_buf())
    }
}

/// Never prints a database password.
impl fmt::Display for LedgerAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerAt::File(path) => write!(f, "{}", path.display()),
            LedgerAt::Postgres(url) => f.write_str(&without_password(url)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_a_database_and_anything_else_a_file() {
        let at: LedgerAt = "postgres://u:secret@127.0.0.1:5432/ob".parse().unwrap_or_else(|e| match e {});
        assert!(at.is_shared());
        assert!(!at.to_string().contains("secret"), "{at}");
        let file: LedgerAt = "ledger.redb".parse().unwrap_or_else(|e| match e {});
        assert_eq!(file.file(), Some(Path::new("ledger.redb")));
        assert!(!file.is_shared());
        let pairs: LedgerAt = "host=db password=s3cret dbname=ob".parse().unwrap_or_else(|e| match e {});
        assert!(pairs.is_shared() && !pairs.to_string().contains("s3cret"), "{pairs}");
        let odd: LedgerAt = "runs/a=b.redb".parse().unwrap_or_else(|e| match e {});
        assert!(!odd.is_shared(), "a path with = in it is still a path");
    }
}
