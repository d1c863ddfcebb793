//! Waking the callers that wait for another host's operation: the jobs `NOTIFY` on the channel
//! [`CHANNEL`] with the operation key when an operation ends, is settled or is taken over (the
//! notification is sent on COMMIT, so it never announces what was not recorded), and one
//! connection per host `LISTEN`s and hands each key to the waiters of this host.
//!
//! A notification can be lost (the listening connection dropped, or the change committed between
//! a waiter's look and its subscription), so a wait also ends after [`LOOK_AGAIN`] at most: a
//! waiter looks again once a second instead of 40 times (the poll of a store that cannot
//! announce), which is what keeps many waiters on one database from crowding out its owner.

use std::time::Duration;

use deadpool_postgres::tokio_postgres::{AsyncMessage, Client, Config, NoTls};
use tokio::sync::{Mutex, broadcast};

use super::db::Tx;
use crate::LedgerError;

/// The longest a waiter waits for an announcement before it looks again anyway.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// The channel every host listens on; the payload is an operation key.
pub(super) const CHANNEL: &str = "oncebox_changed";

/// Announces, on commit, that operation `key` changed.
pub(super) async fn changed(tx: &Tx<'_>, key: &str) -> Result<(), LedgerError> {
    tx.exec("SELECT pg_notify($1, $2)", &[&CHANNEL, &key]).await.map(|_| ())
}

/// The same announcement of each of `keys`, as one statement of a group's writes (`group.rs`).
pub(super) fn changed_sql(keys: Vec<String>) -> super::pipeline::Sql {
    super::pipeline::sql!("SELECT pg_notify($1, k) FROM unnest($2::text[]) AS k", CHANNEL, keys)
}

/// This host's listening connection, started on the first wait and again after it dropped.
pub(super) struct Listener {
    config: Config,
    live: Mutex<Option<Live>>,
}

struct Live {
    /// Held so the connection lives as long as the listener (dropping it ends the connection).
    _client: Client,
    keys: broadcast::Sender<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Listener {
    pub fn new(config: Config) -> Self {
        Listener { config, live: Mutex::new(None) }
    }

    /// Resolves when `key` is announced, or after `timeout` (or [`LOOK_AGAIN`], if sooner).
    pub async fn wait(&self, key: &str, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout.min(LOOK_AGAIN);
        let Some(mut keys) = tokio::time::timeout_at(deadline, self.subscribe()).await.ok().flatten() else {
            tokio::time::sleep_until(deadline).await;
            return;
        };
        let announced = async {
            loop {
                match keys.recv().await {
                    Ok(changed) if changed == key => return,
                    Ok(_) => {}
                    // Announcements were missed: one of them may have been this key's.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        };
        let _ = tokio::time::timeout_at(deadline, announced).await;
    }

    /// A receiver of announced keys, starting the listening connection if none is live.
    async fn subscribe(&self) -> Option<broadcast::Receiver<String>> {
        let mut live = self.live.lock().await;
        if let Some(current) = live.as_ref()
            && !current.task.is_finished()
        {
            return Some(current.keys.subscribe());
        }
        *live = None;
        let (client, mut connection) = self.config.connect(NoTls).await.ok()?;
        let (keys, receiver) = broadcast::channel(256);
        let sender = keys.clone();
        let task = tokio::spawn(async move {
            while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                if let AsyncMessage::Notification(notification) = message {
                    let _ = sender.send(notification.payload().to_string());
                }
            }
        });
        if client.batch_execute(&format!("LISTEN {CHANNEL}")).await.is_err() {
            task.abort();
            return None;
        }
        *live = Some(Live { _client: client, keys, task });
        Some(receiver)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(live) = self.live.get_mut().take() {
            live.task.abort();
        }
    }
}
