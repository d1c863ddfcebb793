//! A group's writes (`group.rs`), gathered from its jobs' decisions (`grouped.rs`) by kind of row,
//! as a part per kind (the rows as arrays, `unnest`ed by the server), which `combine.rs` sends as
//! one statement where it may.
//!
//! A statement that joins a table with its `unnest`ed rows also names their keys with `= ANY`, so
//! that the plan it keeps for the connection's life reads those rows by the table's key however
//! small the table was when it was planned (`options.rs`). The same holds for `grouped.rs`'s reads.
//! An index searched with two `= ANY` columns is searched once per pair of values: effects are
//! named by their operations' keys only (an operation has few), KV entries by both columns (a
//! group's keys share a few namespaces).

use std::collections::{HashMap, HashSet};

use super::combine::{Check, Part, RowName, STATEMENT_BYTES, row};
use super::db::{encode, int};
use super::jobs::effect_status_str;
use super::notify;
use super::pipeline::{Sql, sql};
use crate::{EffectRecord, LedgerError, OperationRecord};

/// An operation row as its columns.
pub(super) struct OperationRow {
    key: String,
    run_id: String,
    step_id: String,
    tool: String,
    status: &'static str,
    fence: i64,
    lease_until_ms: i64,
    record: Vec<u8>,
    /// The token of the claim making the row (a new operation's), written by inserts only.
    claim: i64,
}

impl OperationRow {
    pub fn of(op: &OperationRecord) -> Result<Self, LedgerError> {
        Ok(OperationRow {
            key: op.key.clone(),
            run_id: op.run_id.clone(),
            step_id: op.step_id.clone(),
            tool: op.tool.clone(),
            status: op.status.as_str(),
            fence: int(op.fence),
            lease_until_ms: int(op.lease_until_ms),
            record: encode(op)?,
            claim: 0,
        })
    }

    /// The row of a new operation claimed with `token` (`riding.rs`).
    pub fn claimed_with(self, token: i64) -> Self {
        OperationRow { claim: token, ..self }
    }
}

/// An effect row as its columns.
pub(super) struct EffectRow {
    operation_key: String,
    effect_key: String,
    status: &'static str,
    dispatches: i64,
    first_dispatched_ms: i64,
    label: String,
    record: Vec<u8>,
}

impl EffectRow {
    /// `effect`'s row under operation `operation_key` (the job's, whose lock is held: a staged
    /// record naming another operation is still written under its own).
    pub fn of(operation_key: &str, effect: &EffectRecord) -> Result<Self, LedgerError> {
        Ok(EffectRow {
            operation_key: operation_key.to_string(),
            effect_key: effect.key.clone(),
            status: effect_status_str(effect.status),
            dispatches: i64::from(effect.dispatches),
            first_dispatched_ms: int(effect.first_dispatched_ms),
            label: effect.label.clone(),
            record: encode(effect)?,
        })
    }
}

/// A KV value written and its version.
type KvValue = (Vec<u8>, i64);

/// A group's writes, by kind of row, in job order within each kind.
#[derive(Default)]
pub(super) struct Writes {
    /// New operations (claims).
    pub inserted: Vec<OperationRow>,
    /// Operations written over the row that held (fence, status); with `recorded`.
    pub updated: Vec<(OperationRow, bool, i64, &'static str)>,
    /// New effect records (write-aheads); none may be there.
    pub effects_new: Vec<EffectRow>,
    /// Effect records over the one at (status, dispatches).
    pub effects_changed: Vec<(EffectRow, &'static str, i64)>,
    /// Effect records written whatever was there (local effects, with their writes).
    pub effects_applied: Vec<EffectRow>,
    /// KV writes, in order: a value and its version, or a removal.
    pub kv: Vec<(String, String, Option<KvValue>)>,
    /// Outbox messages: (seq, topic, record).
    pub outbox: Vec<(i64, String, Vec<u8>)>,
    /// Attempt records: (operation key, number, record).
    pub attempts: Vec<(String, i64, Vec<u8>)>,
    /// Operations whose change other hosts' waiters should hear of.
    pub announce: Vec<String>,
    /// Operations written by a job that holds their run's lock (`grouped::Job::run_lock`), as
    /// written: the group reindexes them (`index.rs`).
    pub reindex: Vec<OperationRecord>,
}

impl Writes {
    pub fn is_empty(&self) -> bool {
        self.inserted.is_empty()
            && self.updated.is_empty()
            && self.effects_new.is_empty()
            && self.effects_changed.is_empty()
            && self.effects_applied.is_empty()
            && self.kv.is_empty()
            && self.outbox.is_empty()
            && self.attempts.is_empty()
            && self.announce.is_empty()
            && self.reindex.is_empty()
    }

    pub fn extend(&mut self, other: Writes) {
        self.inserted.extend(other.inserted);
        self.updated.extend(other.updated);
        self.effects_new.extend(other.effects_new);
        self.effects_changed.extend(other.effects_changed);
        self.effects_applied.extend(other.effects_applied);
        self.kv.extend(other.kv);
        self.outbox.extend(other.outbox);
        self.attempts.extend(other.attempts);
        self.announce.extend(other.announce);
        self.reindex.extend(other.reindex);
    }

    /// A part per kind of row written (parents before the rows that refer to them), or a few
    /// where the rows are large ([`STATEMENT_BYTES`]); the checked ones fail unless they changed
    /// exactly the rows given. `combine.rs` makes them one statement where it may.
    pub fn parts(self) -> Vec<Part> {
        let mut out = Vec::new();
        // New effects only: a staged effect already on record (a changed one's) is not applied
        // again (`grouped::unapplied`).
        let own: HashSet<(String, String)> = self.effects_new.iter().map(EffectRow::id).collect();
        for (rows, bytes) in chunks(self.inserted, |r| r.record.len()) {
            let check = Check::Exactly(rows.len() as i64);
            let names = rows.iter().map(|r| row(OPERATIONS, &[&r.key])).collect();
            let claims: Vec<i64> = rows.iter().map(|r| r.claim).collect();
            out.push(Part::of(
                sql!(
                    "INSERT INTO oncebox_operations \
                     (key, run_id, step_id, tool, status, fence, lease_until_ms, recorded, record, claim) \
                     SELECT k, r, s, t, st, f, l, false, rec, c FROM unnest($1::text[], $2::text[], $3::text[], \
                     $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::bytea[], $9::bigint[]) \
                     AS u(k, r, s, t, st, f, l, rec, c) \
                     ON CONFLICT (key) DO NOTHING RETURNING 1",
                    rows.iter().map(|r| r.key.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|r| r.step_id.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|r| r.tool.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|r| r.status).collect::<Vec<_>>(),
                    rows.iter().map(|r| r.fence).collect::<Vec<_>>(),
                    rows.iter().map(|r| r.lease_until_ms).collect::<Vec<_>>(),
                    rows.into_iter().map(|r| r.record).collect::<Vec<_>>(),
                    claims,
                ),
                check,
                names,
                bytes,
            ));
        }
        for (rows, bytes) in chunks(self.updated, |(r, ..)| r.record.len()) {
            let check = Check::Exactly(rows.len() as i64);
            let names = rows.iter().map(|(r, ..)| row(OPERATIONS, &[&r.key])).collect();
            out.push(Part::of(
                sql!(
                    "UPDATE oncebox_operations o SET status = u.st, fence = u.f, lease_until_ms = u.l, \
                     recorded = u.rd, record = u.rec FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], \
                     $5::bigint[], $6::bool[], $7::bytea[], $8::text[]) AS u(k, held, st, f, l, rd, rec, held_st) \
                     WHERE o.key = ANY($1::text[]) AND o.key = u.k AND o.fence = u.held AND o.status = u.held_st \
                     RETURNING 1",
                    rows.iter().map(|(r, ..)| r.key.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|(_, _, held, _)| *held).collect::<Vec<_>>(),
                    rows.iter().map(|(r, ..)| r.status).collect::<Vec<_>>(),
                    rows.iter().map(|(r, ..)| r.fence).collect::<Vec<_>>(),
                    rows.iter().map(|(r, ..)| r.lease_until_ms).collect::<Vec<_>>(),
                    rows.iter().map(|(_, recorded, ..)| *recorded).collect::<Vec<_>>(),
                    rows.iter().map(|(r, ..)| r.record.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|(.., status)| *status).collect::<Vec<_>>(),
                ),
                check,
                names,
                bytes,
            ));
        }
        // The last write of each KV key is what the keys hold after the group, as after its jobs
        // one by one (one statement may not write a row twice).
        let mut last = HashMap::new();
        for (namespace, key, value) in self.kv {
            last.insert((namespace, key), value);
        }
        let mut last: Vec<_> = last.into_iter().collect();
        last.sort_by(|a, b| a.0.cmp(&b.0));
        let (mut set, mut removed) = (Vec::new(), Vec::new());
        for ((namespace, key), value) in last {
            match value {
                Some((value, version)) => set.push((namespace, key, value, version)),
                None => removed.push((namespace, key)),
            }
        }
        for (rows, bytes) in chunks(removed, |(n, k)| n.len() + k.len()) {
            let names = rows.iter().map(|(n, k)| row(KV, &[n, k])).collect();
            let (namespaces, keys): (Vec<String>, Vec<String>) = rows.into_iter().unzip();
            out.push(Part::of(
                sql!(
                    "DELETE FROM oncebox_kv kv USING unnest($1::text[], $2::text[]) AS u(n, k) \
                     WHERE kv.namespace = ANY($1::text[]) AND kv.key = ANY($2::text[]) \
                     AND kv.namespace = u.n AND kv.key = u.k",
                    namespaces,
                    keys,
                ),
                Check::None,
                names,
                bytes,
            ));
        }
        for (rows, bytes) in chunks(set, |(n, k, v, _)| n.len() + k.len() + v.len()) {
            let names = rows.iter().map(|(n, k, ..)| row(KV, &[n, k])).collect();
            out.push(Part::of(
                sql!(
                    "INSERT INTO oncebox_kv (namespace, key, value, version) \
                     SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[]) \
                     ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, version = excluded.version",
                    rows.iter().map(|(n, ..)| n.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|(_, k, ..)| k.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|(.., v, _)| v.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|(.., version)| *version).collect::<Vec<_>>(),
                ),
                Check::None,
                names,
                bytes,
            ));
        }
        for (rows, bytes) in chunks(self.outbox, |(_, topic, record)| topic.len() + record.len()) {
            let names = rows.iter().map(|(seq, ..)| row(OUTBOX, &[&seq.to_string()])).collect();
            out.push(Part::of(
                sql!(
                    "INSERT INTO oncebox_outbox (seq, topic, delivered, record) \
                     SELECT s, t, false, r FROM unnest($1::bigint[], $2::text[], $3::bytea[]) AS u(s, t, r)",
                    rows.iter().map(|(seq, ..)| *seq).collect::<Vec<_>>(),
                    rows.iter().map(|(_, topic, _)| topic.clone()).collect::<Vec<_>>(),
                    rows.into_iter().map(|(.., record)| record).collect::<Vec<_>>(),
                ),
                Check::None,
                names,
                bytes,
            ));
        }
        for (rows, bytes) in chunks(self.effects_new, |r| r.record.len()) {
            let check = Check::Exactly(rows.len() as i64);
            let names = rows.iter().map(EffectRow::name).collect();
            out.push(Part::of(
                effect_rows(
                    "INSERT INTO oncebox_effects \
                     (operation_key, effect_key, status, dispatches, first_dispatched_ms, label, record) \
                     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], \
                     $7::bytea[]) ON CONFLICT (operation_key, effect_key) DO NOTHING RETURNING 1",
                    rows,
                ),
                check,
                names,
                bytes,
            ));
        }
        for (rows, bytes) in chunks(self.effects_changed, |(r, ..)| r.record.len()) {
            let check = Check::Exactly(rows.len() as i64);
            let names = rows.iter().map(|(r, ..)| r.name()).collect();
            let (rows, held): (Vec<EffectRow>, Vec<(&'static str, i64)>) =
                rows.into_iter().map(|(row, status, dispatches)| (row, (status, dispatches))).unzip();
            let (statuses, dispatches): (Vec<&'static str>, Vec<i64>) = held.into_iter().unzip();
            let mut statement = effect_rows(
                "UPDATE oncebox_effects e SET status = u.st, dispatches = u.d, first_dispatched_ms = u.fd, \
                 label = u.lb, record = u.rec FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], \
                 $5::bigint[], $6::text[], $7::bytea[], $8::text[], $9::bigint[]) \
                 AS u(ok, ek, st, d, fd, lb, rec, held_st, held_d) \
                 WHERE e.operation_key = ANY($1::text[]) \
                 AND e.operation_key = u.ok AND e.effect_key = u.ek AND e.status = u.held_st \
                 AND e.dispatches = u.held_d RETURNING 1",
                rows,
            );
            statement.params.push(Box::new(statuses));
            statement.params.push(Box::new(dispatches));
            out.push(Part::of(statement, check, names, bytes));
        }
        // One row per effect: a later record of the same effect replaces an earlier one, and a
        // write-ahead's own record the staged one of its key (its job applies the staged writes,
        // then writes its own record, as every backend does).
        let mut applied: Vec<EffectRow> = Vec::with_capacity(self.effects_applied.len());
        for row in self.effects_applied.into_iter().filter(|row| !own.contains(&row.id())) {
            applied.retain(|r| (&r.operation_key, &r.effect_key) != (&row.operation_key, &row.effect_key));
            applied.push(row);
        }
        for (rows, bytes) in chunks(applied, |r| r.record.len()) {
            let names = rows.iter().map(EffectRow::name).collect();
            out.push(Part::of(
                effect_rows(
                    "INSERT INTO oncebox_effects \
                     (operation_key, effect_key, status, dispatches, first_dispatched_ms, label, record) \
                     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], \
                     $7::bytea[]) ON CONFLICT (operation_key, effect_key) DO UPDATE SET \
                     status = excluded.status, dispatches = excluded.dispatches, \
                     first_dispatched_ms = excluded.first_dispatched_ms, label = excluded.label, record = excluded.record",
                    rows,
                ),
                Check::None,
                names,
                bytes,
            ));
        }
        for (rows, bytes) in chunks(self.attempts, |(key, _, record)| key.len() + record.len()) {
            let names = rows.iter().map(|(key, number, _)| row(ATTEMPTS, &[key, &number.to_string()])).collect();
            out.push(Part::of(
                sql!(
                    "INSERT INTO oncebox_attempts (operation_key, number, record) \
                     SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[]) \
                     ON CONFLICT (operation_key, number) DO UPDATE SET record = excluded.record",
                    rows.iter().map(|(key, ..)| key.clone()).collect::<Vec<_>>(),
                    rows.iter().map(|(_, number, _)| *number).collect::<Vec<_>>(),
                    rows.into_iter().map(|(.., record)| record).collect::<Vec<_>>(),
                ),
                Check::None,
                names,
                bytes,
            ));
        }
        if !self.announce.is_empty() {
            out.push(Part::of(notify::changed_sql(self.announce), Check::Evaluated, Vec::new(), 0));
        }
        out
    }
}

/// The tables' names, as [`row`] names their rows.
const OPERATIONS: &str = "oncebox_operations";
const KV: &str = "oncebox_kv";
const OUTBOX: &str = "oncebox_outbox";
const EFFECTS: &str = "oncebox_effects";
const ATTEMPTS: &str = "oncebox_attempts";

impl EffectRow {
    /// Its operation's key and its own.
    fn id(&self) -> (String, String) {
        (self.operation_key.clone(), self.effect_key.clone())
    }

    /// Its row, for [`Part::rows`].
    fn name(&self) -> RowName {
        row(EFFECTS, &[&self.operation_key, &self.effect_key])
    }
}

/// `rows` in runs of at most [`STATEMENT_BYTES`] (by `size`, a row's variable part), each run at
/// least one row, with its bytes; none if there are no rows.
fn chunks<T>(rows: Vec<T>, size: impl Fn(&T) -> usize) -> Vec<(Vec<T>, usize)> {
    let mut out: Vec<(Vec<T>, usize)> = Vec::new();
    for row in rows {
        let n = size(&row) + 64;
        match out.last_mut() {
            Some((run, bytes)) if *bytes + n <= STATEMENT_BYTES => {
                *bytes += n;
                run.push(row);
            }
            _ => out.push((vec![row], n)),
        }
    }
    out
}

/// `text` with the seven columns of effect rows as its first seven (array) parameters.
fn effect_rows(text: &'static str, rows: Vec<EffectRow>) -> Sql {
    sql!(
        text,
        rows.iter().map(|r| r.operation_key.clone()).collect::<Vec<_>>(),
        rows.iter().map(|r| r.effect_key.clone()).collect::<Vec<_>>(),
        rows.iter().map(|r| r.status).collect::<Vec<_>>(),
        rows.iter().map(|r| r.dispatches).collect::<Vec<_>>(),
        rows.iter().map(|r| r.first_dispatched_ms).collect::<Vec<_>>(),
        rows.iter().map(|r| r.label.clone()).collect::<Vec<_>>(),
        rows.into_iter().map(|r| r.record).collect::<Vec<_>>(),
    )
}
