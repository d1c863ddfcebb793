//! The answers this host let ride (`group.rs`) that no flushed COMMIT has carried to disk yet,
//! and the operations whose ridden answer the database lost.
//!
//! An answer committed without waiting for its flush is lost if the server crashes or restarts
//! (a backend killed by the OOM killer is enough, or a failover) before its WAL writer flushed it;
//! the effect then reads `dispatched` again, in doubt. A redb process dies with its riding answers,
//! but this host lives on, and its tool holds the answer the ledger lost: its next write-ahead for
//! that operation would send the next effect on it. So a write-ahead whose operation has an
//! unflushed answer first checks that the answer is still there, in the group's own reads, under
//! its lock; if it is not, the write-ahead is refused (nothing is sent) and so is every later one
//! of the operation, until its attempt is recorded. The attempt's record cannot finish it either
//! (`refused_finish`: the effect is in doubt), and the next attempt reads the ledger afresh and
//! finds the effect in doubt, as after any crash between a send and its answer.

use std::collections::HashMap;

use super::grouped::{Job, Read};
use crate::{EffectStatus, LedgerError};

#[derive(Default)]
pub(super) struct Riding {
    /// Per operation, the effects whose answers rode and that no flushed COMMIT of a write of the
    /// operation has followed since.
    unflushed: HashMap<String, Vec<String>>,
    /// Operations whose ridden answer was found lost: the effect, until the attempt is recorded.
    lost: HashMap<String, String>,
}

impl Riding {
    /// Why `job` must be refused, if it is a write-ahead (or any effect write that waits for its
    /// flush) of an operation whose ridden answer is no longer in `read`, or was found lost before.
    pub fn refusal(&mut self, job: &Job, read: &Read) -> Option<LedgerError> {
        let Job::PutEffect { effect, .. } = job else { return None };
        if job.may_ride() {
            return None;
        }
        let operation = effect.operation_key.as_str();
        let refused = |effect_key: &str| LedgerError::AnswerLost {
            operation_key: operation.to_string(),
            effect_key: effect_key.to_string(),
        };
        if let Some(lost) = self.lost.get(operation) {
            return Some(refused(lost));
        }
        let lost = self
            .unflushed
            .get(operation)?
            .iter()
            .find(|key| read.effect_status(operation, key) == Some(EffectStatus::Dispatched))?
            .clone();
        let refusal = refused(&lost);
        self.lost.insert(operation.to_string(), lost);
        Some(refusal)
    }

    /// `jobs` committed (those `writing` wrote), without waiting for their flush if `rode`. A
    /// flushed COMMIT of an operation's write-ahead or attempt came after its reads found the
    /// operation's ridden answers there (else the write-ahead was refused, or the attempt could
    /// not finish it), so it carried them to disk; an attempt's record ends its operation's loss.
    pub fn committed(&mut self, jobs: &[Job], writing: &[bool], rode: bool) {
        for (job, _) in jobs.iter().zip(writing).filter(|(_, wrote)| **wrote) {
            match job {
                Job::PutEffect { effect, .. } if rode => {
                    self.unflushed.entry(effect.operation_key.clone()).or_default().push(effect.key.clone());
                }
                Job::PutEffect { effect, .. } => {
                    self.unflushed.remove(&effect.operation_key);
                }
                Job::RecordAttempt { attempt, .. } => {
                    self.unflushed.remove(&attempt.operation_key);
                    self.lost.remove(&attempt.operation_key);
                }
                Job::Claim(_) => {}
            }
        }
    }
}
