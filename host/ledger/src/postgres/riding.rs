//! What this host let ride (`group.rs`: a new operation's claim, an effect's answer) that no
//! flushed COMMIT of its owner's own has carried to disk yet.
//!
//! A write committed without waiting for its flush is lost if the server crashes (or is stopped
//! in immediate mode; a backend killed by the OOM killer is enough) before its WAL writer wrote it
//! out. A redb process dies with what rode, but this host lives on, and its callers hold what the
//! ledger lost. So the owner's next flushed write first checks, in the group's own reads taken
//! under the operation's lock, that what rode is still there; if not, the write is refused, and
//! nothing of it is written or sent. A refusal writes nothing, so every later write of that owner
//! is refused the same way.
//!
//! - **A claim** (a new operation's, fence 1) is lost with its row. Another claimant may then make
//!   the row again, with fence 1 too: the row carries the random token of the claim that made it,
//!   and the owner's next flushed write (a write-ahead, before anything is sent; or the attempt's
//!   record, before any local effect is written), like its lease renewal, is refused (`ClaimLost`:
//!   `rules::claim_lost`) unless the row is still its claim's. A new claim here of an operation
//!   whose claim here rode and is gone takes a drawn fence (`grouped::claim`): both owners would
//!   write with fence 1 from this one host otherwise.
//! - **An answer** is lost with the effect back at `dispatched`, in doubt, and the tool holds it:
//!   the owner's next write-ahead would send the next effect on it. It is refused (`AnswerLost`)
//!   until the attempt is recorded, which cannot finish the operation completed or failed either
//!   (`refused_finish`: the effect is in doubt); the next attempt reads the ledger afresh and
//!   finds the effect in doubt, as after any crash between a send and its answer.
//!
//! Entries are kept per operation and dropped by the owner's next flushed write of it, or by a
//! claim of it here that waited for its flush; those of an owner that never writes again (its call
//! dropped, its lease lost) stay until the operation is claimed here again.

use std::collections::HashMap;

use super::grouped::{Job, Read};
use crate::{EffectStatus, LedgerError};

#[derive(Default)]
pub(super) struct Riding {
    /// Per operation, the token of its claim made here that rode (fence 1), while no flushed
    /// COMMIT of its owner's writes has followed.
    claims: HashMap<String, i64>,
    /// Per operation, (the owner's fence, effect key) of each answer that rode and that no flushed
    /// COMMIT of that owner's own writes has followed since.
    answers: HashMap<String, Vec<(u64, String)>>,
}

/// A random token for a claim: never 0, which a row made by a host that does not write tokens has.
pub(super) fn token() -> Result<i64, String> {
    let drawn = getrandom::u64().map_err(|e| format!("no randomness for a claim's token: {e}"))?;
    // Any value but 0, negative ones too: the column is a bigint.
    let token = i64::from_ne_bytes(drawn.to_ne_bytes());
    Ok(if token == 0 { 1 } else { token })
}

impl Riding {
    /// The token of the claim of `operation` made here that rode, while its owner (fence 1) has
    /// not written since. Every write of that owner checks that the row is still this claim's
    /// (`grouped::owned`; `jobs::renew`), and a new claim of it here finding no row takes a drawn
    /// fence (`grouped::claim`).
    pub fn ridden_claim(&self, operation: &str) -> Option<i64> {
        self.claims.get(operation).copied()
    }

    /// Those of `operations`' claims that rode: [`Riding::ridden_claim`] for a group.
    pub fn ridden_claims<'o>(&self, operations: impl Iterator<Item = &'o str>) -> HashMap<String, i64> {
        operations.filter_map(|op| Some((op.to_string(), self.ridden_claim(op)?))).collect()
    }

    /// Why `job`, decided to be written, must be refused after all: a write-ahead (any effect
    /// write that waits for its flush) of an owner one of whose ridden answers `read` no longer
    /// holds. (A lost claim is refused by the ownership check itself: `grouped::owned`.)
    pub fn refusal(&self, job: &Job, read: &Read) -> Option<LedgerError> {
        let Job::PutEffect { fence, effect, .. } = job else { return None };
        if job.may_ride() {
            return None;
        }
        let operation = effect.operation_key.as_str();
        let (_, lost) = self.answers.get(operation)?.iter().find(|(owner, key)| {
            owner == fence && read.effect_status(operation, key) == Some(EffectStatus::Dispatched)
        })?;
        Some(LedgerError::AnswerLost { operation_key: operation.to_string(), effect_key: lost.clone() })
    }

    /// `jobs` committed (those `writing` wrote), without waiting for their flush if `rode`.
    /// A flushed write of an owner was not refused, so its reads found what the owner let ride
    /// there, and its COMMIT carried it to disk. An attempt's record ends the attempt (what it
    /// finds lost is the next attempt's to read). A claim starts a new owner.
    pub fn committed(&mut self, jobs: &[Job], writing: &[bool], rode: bool) {
        for (job, _) in jobs.iter().zip(writing).filter(|(_, wrote)| **wrote) {
            match job {
                Job::PutEffect { fence, effect, .. } if rode => {
                    let answers = self.answers.entry(effect.operation_key.clone()).or_default();
                    answers.push((*fence, effect.key.clone()));
                }
                Job::PutEffect { fence, effect, .. } => self.flushed(&effect.operation_key, *fence),
                Job::RecordAttempt { fence, attempt, .. } => self.flushed(&attempt.operation_key, *fence),
                Job::Claim { req, token } => {
                    self.answers.remove(&req.key);
                    if rode {
                        self.claims.insert(req.key.clone(), *token);
                    } else {
                        self.claims.remove(&req.key);
                    }
                }
            }
        }
    }

    fn flushed(&mut self, operation: &str, fence: u64) {
        if fence == 1 {
            self.claims.remove(operation);
        }
        if let Some(answers) = self.answers.get_mut(operation) {
            answers.retain(|(owner, _)| *owner != fence);
            if answers.is_empty() {
                self.answers.remove(operation);
            }
        }
    }
}
