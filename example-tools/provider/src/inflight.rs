//! Requests accepted but not yet committed, so a test can wait for a commit that
//! lands after the client stopped listening before it counts.
//!
//! Most requests commit in the same step that accepts them. A `commit-after-delay`
//! request does not: its commit runs in a task of its own, possibly long after the
//! client gave up, and counting before it lands would make a correct client look
//! as if it had lost an effect.

use std::sync::Arc;

use tokio::sync::watch;

/// The number of accepted, uncommitted requests, observable without polling.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    count: watch::Sender<usize>,
}

impl InFlight {
    /// Counts a request as in flight until the returned guard is dropped.
    pub(crate) fn accept(self: &Arc<Self>) -> Accepted {
        self.count.send_modify(|count| *count += 1);
        Accepted { in_flight: Arc::clone(self) }
    }

    pub(crate) fn count(&self) -> usize {
        *self.count.borrow()
    }

    /// Resolves as soon as no request is in flight (at once if none is).
    pub(crate) async fn settled(&self) {
        let mut count = self.count.subscribe();
        // `wait_for` fails only once the sender is gone, and `self` holds it.
        if count.wait_for(|count| *count == 0).await.is_err() {
            tracing::debug!("in-flight counter closed while waiting for it to settle");
        }
    }
}

/// An accepted request that has not committed yet. Dropping it (after the commit,
/// or when the request is abandoned before one) takes the request out of flight.
#[derive(Debug)]
pub(crate) struct Accepted {
    in_flight: Arc<InFlight>,
}

impl Drop for Accepted {
    fn drop(&mut self) {
        self.in_flight.count.send_modify(|count| *count = count.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn settled_waits_for_the_last_guard() {
        let in_flight = Arc::new(InFlight::default());
        in_flight.settled().await;

        let first = in_flight.accept();
        let second = in_flight.accept();
        assert_eq!(in_flight.count(), 2);
        drop(first);
        let waiter = {
            let in_flight = Arc::clone(&in_flight);
            tokio::spawn(async move { in_flight.settled().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "one request is still in flight");
        drop(second);
        let settled = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(settled, Ok(Ok(()))), "settles once the last guard is dropped");
        assert_eq!(in_flight.count(), 0);
    }
}
