//! The outbox's delivery records in the redb file: a topic's pending messages read in order from
//! `OUTBOX_PENDING`, and a send's answer written (through the group-commit writer) into the
//! message's own record, which leaves the pending index once it is delivered.

use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

use super::tables::*;
use super::writer::Durability;
use super::{DeliveryAnswer, LedgerError, OutboxMessage, RedbStore, decode, get, put};

impl RedbStore {
    /// Up to `limit` of `topic`'s undelivered messages, in sequence order.
    pub fn outbox_pending(&self, topic: &str, limit: usize) -> Result<Vec<OutboxMessage>, LedgerError> {
        let txn = self.db.begin_read()?;
        let (pending, messages) = (txn.open_table(OUTBOX_PENDING)?, txn.open_table(OUTBOX)?);
        let mut out = Vec::new();
        for entry in pending.range((topic, 0)..=(topic, u64::MAX))? {
            if out.len() >= limit {
                break;
            }
            let seq = entry?.0.value().1;
            let message = get(&messages, seq)?
                .ok_or_else(|| LedgerError::Corrupt { what: format!("outbox message {seq} is pending but missing") })?;
            out.push(message);
        }
        Ok(out)
    }

    /// See [`super::Store::enqueue_once`].
    pub async fn enqueue_once(&self, topic: &str, key: &str, payload: &str) -> Result<bool, LedgerError> {
        let (topic, key, payload) = (topic.to_string(), key.to_string(), payload.to_string());
        let now = oncebox_core::clock::now_ms();
        self.writer
            .submit(move |txn| enqueue_once(txn, &topic, &key, &payload, now), |wrote| *wrote, Durability::Now)
            .await
    }

    /// Records one send's answer for message `seq` (see [`super::Store::record_delivery`]).
    pub async fn record_delivery(&self, seq: u64, answer: &DeliveryAnswer) -> Result<OutboxMessage, LedgerError> {
        let answer = answer.clone();
        let (message, _) = self
            .writer
            .submit(move |txn| record_delivery(txn, seq, &answer), |(_, wrote)| *wrote, Durability::Now)
            .await?;
        Ok(message)
    }
}

/// The write job of `enqueue_once`: nothing when the key was enqueued before; else the message,
/// its pending entry and its key, numbered as an outbox effect's message is.
fn enqueue_once(
    txn: &WriteTransaction,
    topic: &str,
    key: &str,
    payload: &str,
    now_ms: u64,
) -> Result<bool, LedgerError> {
    let mut notices = txn.open_table(NOTICES)?;
    let noticed = format!("{topic}\n{key}");
    if notices.get(noticed.as_str())?.is_some() {
        return Ok(false);
    }
    let mut meta = txn.open_table(META)?;
    let seq = meta.get(OUTBOX_SEQ_KEY)?.map_or(0, |v| v.value()) + 1;
    meta.insert(OUTBOX_SEQ_KEY, seq)?;
    let message = OutboxMessage::notice(seq, key, topic, payload, now_ms);
    put(&mut txn.open_table(OUTBOX)?, seq, &message)?;
    txn.open_table(OUTBOX_PENDING)?.insert((topic, seq), ())?;
    notices.insert(noticed.as_str(), seq)?;
    Ok(true)
}

/// The write job: decides from the message's record, then writes it (and drops its pending entry
/// once delivered). Answers the message as recorded, and whether anything was written (an answer
/// about a message already delivered changes nothing, and costs no commit).
fn record_delivery(
    txn: &WriteTransaction,
    seq: u64,
    answer: &DeliveryAnswer,
) -> Result<(OutboxMessage, bool), LedgerError> {
    let mut messages = txn.open_table(OUTBOX)?;
    let mut message: OutboxMessage = get(&messages, seq)?.ok_or(LedgerError::NoSuchMessage { seq })?;
    let delivery = message.delivery.after(answer);
    if delivery == message.delivery {
        return Ok((message, false));
    }
    // Decided; from here on only writes.
    message.delivery = delivery;
    put(&mut messages, seq, &message)?;
    if message.delivery.is_delivered() {
        txn.open_table(OUTBOX_PENDING)?.remove((message.topic.as_str(), seq))?;
        super::aged::delivered(txn, &message)?;
    }
    Ok((message, true))
}

/// Schema 4: every message of an older ledger is pending (nothing delivered them), so each gets
/// its entry in the index, in its topic's order.
pub(super) fn migrate_pending(txn: &WriteTransaction) -> Result<(), LedgerError> {
    let messages = txn.open_table(OUTBOX)?;
    let mut pending = txn.open_table(OUTBOX_PENDING)?;
    for entry in messages.iter()? {
        let (seq, value) = entry?;
        let seq = seq.value();
        let message: OutboxMessage = decode("outbox", &seq.to_string(), value.value())?;
        if !message.delivery.is_delivered() {
            pending.insert((message.topic.as_str(), seq), ())?;
        }
    }
    Ok(())
}
