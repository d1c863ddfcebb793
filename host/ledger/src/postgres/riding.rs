//! The answers this host let ride (`group.rs`) that no flushed COMMIT of their operation's own has
//! carried to disk yet.
//!
//! An answer committed without waiting for its flush is lost if the server crashes (or is stopped
//! in immediate mode; a backend killed by the OOM killer is enough) before its WAL writer wrote it
//! out: the effect then reads `dispatched` again, in doubt. A redb process dies with its riding
//! answers, but this host lives on, and its tool holds the answer the ledger lost: its next
//! write-ahead for that operation would send the next effect on it. So a write-ahead of an owner
//! with unflushed answers first checks, in the group's own reads taken under the operation's lock,
//! that they are still there; if one is not, the write-ahead is refused and nothing is sent. A
//! refusal writes nothing, so every later write-ahead of the owner is refused the same way, until
//! its attempt is recorded: that record cannot finish the operation completed or failed either
//! (`refused_finish`: the effect is in doubt), and the next attempt reads the ledger afresh and
//! finds the effect in doubt, as after any crash between a send and its answer.
//!
//! Entries are kept per operation and owner (fence) and dropped by the owner's next flushed write
//! of the operation, or by a claim of the operation here; those of an owner that never writes
//! again (its call dropped, its lease lost) stay until the operation is claimed again here.

use std::collections::HashMap;

use super::grouped::{Job, Read};
use crate::{EffectStatus, LedgerError};

#[derive(Default)]
pub(super) struct Riding {
    /// Per operation, (the owner's fence, effect key) of each answer that rode and that no flushed
    /// COMMIT of that owner's own writes has followed since.
    unflushed: HashMap<String, Vec<(u64, String)>>,
}

impl Riding {
    /// Why `job`, decided to be written, must be refused after all: a write-ahead (or any effect
    /// write that waits for its flush) of an owner one of whose ridden answers `read` no longer
    /// holds.
    pub fn refusal(&self, job: &Job, read: &Read) -> Option<LedgerError> {
        let Job::PutEffect { fence, effect, .. } = job else { return None };
        if job.may_ride() {
            return None;
        }
        let operation = effect.operation_key.as_str();
        let (_, lost) = self.unflushed.get(operation)?.iter().find(|(owner, key)| {
            owner == fence && read.effect_status(operation, key) == Some(EffectStatus::Dispatched)
        })?;
        Some(LedgerError::AnswerLost { operation_key: operation.to_string(), effect_key: lost.clone() })
    }

    /// `jobs` committed (those `writing` wrote), without waiting for their flush if `rode`.
    /// A flushed write-ahead of an owner was not refused, so its reads found the owner's ridden
    /// answers there, and its COMMIT carried them to disk. An attempt's record ends the attempt
    /// (what it finds lost is the next attempt's to read). A claim starts a new owner.
    pub fn committed(&mut self, jobs: &[Job], writing: &[bool], rode: bool) {
        for (job, _) in jobs.iter().zip(writing).filter(|(_, wrote)| **wrote) {
            match job {
                Job::PutEffect { fence, effect, .. } if rode => {
                    let answers = self.unflushed.entry(effect.operation_key.clone()).or_default();
                    answers.push((*fence, effect.key.clone()));
                }
                Job::PutEffect { fence, effect, .. } => self.flushed(&effect.operation_key, *fence),
                Job::RecordAttempt { fence, attempt, .. } => self.flushed(&attempt.operation_key, *fence),
                Job::Claim(req) => {
                    self.unflushed.remove(&req.key);
                }
            }
        }
    }

    fn flushed(&mut self, operation: &str, fence: u64) {
        if let Some(answers) = self.unflushed.get_mut(operation) {
            answers.retain(|(owner, _)| *owner != fence);
            if answers.is_empty() {
                self.unflushed.remove(operation);
            }
        }
    }
}
