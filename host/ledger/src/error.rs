//! The ledger's one error type.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    #[error(
        "the ledger {path} is open in another process; an embedded ledger belongs to one process: \
         serve it from that process, or use a shared backend"
    )]
    AlreadyOpen { path: String },
    /// The file is not a ledger this oncebox can use (not a redb file, a damaged or truncated one,
    /// one of another file format); it was left as it was.
    #[error("{path} is not a usable oncebox ledger: {reason}")]
    Unusable { path: String, reason: String },
    // The redb errors below are part of the message, not sources: a chain printed with `{:#}`
    // would say them twice.
    #[error("cannot open the ledger {path}: {error}")]
    Open { path: String, error: redb::DatabaseError },
    #[error(
        "the key file of this host ({host_key}) is not the one the other hosts of {store} use ({store_key}); \
         give every host the same key file"
    )]
    KeyMismatch { store: String, host_key: String, store_key: String },
    #[error("ledger storage: {0}")]
    Storage(redb::Error),
    #[error("corrupt ledger: {what}")]
    Corrupt { what: String },
    #[error(
        "operation {operation_key} is no longer in doubt: nothing was settled (it was settled meanwhile, or it is \
         being run again, or it ended; look at it again)"
    )]
    NotInDoubt { operation_key: String },
    #[error(
        "operation {operation_key} was taken over (this writer holds fence {fence}, the ledger {current}); \
         the write is refused"
    )]
    Fenced { operation_key: String, fence: u64, current: u64 },
    #[error(
        "effect {effect_key} of operation {operation_key} was recorded with another request; the tool diverged \
         from its first run, nothing was written"
    )]
    Diverged { operation_key: String, effect_key: String },
    #[error(
        "operation {operation_key} cannot be recorded completed or failed: its effect {effect_key} may have \
         taken place"
    )]
    InDoubt { operation_key: String, effect_key: String },
    #[error("operation {operation_key} cannot be recorded failed: its effect {effect_key} took place")]
    EffectTaken { operation_key: String, effect_key: String },
    #[error(
        "effect {effect_key} of operation {operation_key} changed since this writer read it (another owner \
         wrote it); the write is refused"
    )]
    EffectChanged { operation_key: String, effect_key: String },
    #[error(
        "the answer to effect {effect_key} of operation {operation_key}, committed without waiting for its flush, is \
         no longer recorded (the database lost it before it reached the disk): nothing was sent, and that effect is \
         in doubt"
    )]
    AnswerLost { operation_key: String, effect_key: String },
    #[error(
        "the claim of operation {operation_key}, committed without waiting for its flush, is no longer on record (the \
         database lost it before it reached the disk; the operation may have been claimed anew since): this writer \
         no longer owns it, nothing was written"
    )]
    ClaimLost { operation_key: String },
    #[error("kv {namespace}/{key} was written by another step since this attempt read it; nothing was written")]
    KvConflict { namespace: String, key: String },
    #[error("the request for approval of operation {operation_key} changed since it was read; read it again")]
    ApprovalChanged { operation_key: String },
    #[error("operation {operation_key} is claimed or recorded: the approval it ran under can no longer change")]
    ApprovalClosed { operation_key: String },
    #[error("operation {operation_key} is {status}: only completed and failed operations expire")]
    NotExpirable { operation_key: String, status: &'static str },
    #[error("operation {operation_key} has several effects in doubt ({effects}); name the one to settle")]
    Ambiguous { operation_key: String, effects: String },
    // A commit that failed may still have reached the disk (its fsync failed, the page cache did
    // not): nothing more is known of it until the ledger is opened again.
    #[error(
        "the ledger could not commit this write ({reason}); whether it reached the disk is known only \
         once the ledger is opened again"
    )]
    BatchFailed { reason: String },
    #[error("the ledger writer: {reason}")]
    Writer { reason: String },
    #[error("no outbox message with sequence number {seq}")]
    NoSuchMessage { seq: u64 },
    /// A database ledger (PostgreSQL) did not do what was asked: `store` names it (its URL
    /// without a password), `what` says what failed and why, in one line.
    #[error("the ledger {store}: {what}")]
    Database { store: String, what: String },
}

impl LedgerError {
    pub(super) fn open(path: &Path, error: redb::DatabaseError) -> Self {
        use redb::{DatabaseError, StorageError};
        let path = path.display().to_string();
        let reason = match &error {
            DatabaseError::DatabaseAlreadyOpen => return LedgerError::AlreadyOpen { path },
            DatabaseError::Storage(StorageError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                if e.to_string().contains("magic number") {
                    "not a redb database file (it does not start with redb's magic number)".to_string()
                } else {
                    format!("not a redb database file ({e})")
                }
            }
            DatabaseError::Storage(StorageError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                format!("the file ends early, it was truncated ({e})")
            }
            DatabaseError::Storage(StorageError::Corrupted(what)) => format!("the file is damaged ({what})"),
            DatabaseError::UpgradeRequired(version) => {
                format!("redb file format {version}, which this oncebox cannot read")
            }
            _ => return LedgerError::Open { path, error },
        };
        LedgerError::Unusable { path, reason }
    }

    /// Whether the ledger given cannot be used as it is (not a ledger, damaged, of another format
    /// or schema version): the caller's input, not a failure of the host.
    pub fn is_unusable_ledger(&self) -> bool {
        matches!(self, LedgerError::Unusable { .. } | LedgerError::Corrupt { .. })
    }

    /// Whether the writer no longer owns the operation it wrote for: another caller took it over,
    /// or (on PostgreSQL) its claim was lost and the operation claimed anew. Nothing was written;
    /// the operation is its new owner's.
    pub fn is_no_longer_owned(&self) -> bool {
        matches!(self, LedgerError::Fenced { .. } | LedgerError::ClaimLost { .. })
    }
}

impl From<redb::Error> for LedgerError {
    fn from(e: redb::Error) -> Self {
        LedgerError::Storage(e)
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for LedgerError {
            fn from(e: $t) -> Self {
                LedgerError::Storage(e.into())
            }
        }
    )*};
}
from_redb!(redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError);
