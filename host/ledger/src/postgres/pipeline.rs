//! Statements sent together: a round of statements goes to the server in one write, in order, and
//! their answers come back in one read (the extended protocol lets a client send many statements
//! before it reads an answer; tokio-postgres sends each request when its future is first polled).
//! A group's transaction is two such rounds: BEGIN, the locks and the reads; then the writes and
//! COMMIT (`group.rs`).

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use deadpool_postgres::tokio_postgres::types::ToSql;
use deadpool_postgres::tokio_postgres::{Error, Row};
use futures_util::future::{MaybeDone, maybe_done};

/// A statement parameter, owned, so that a statement can wait in a round.
pub(super) type Param = Box<dyn ToSql + Sync + Send>;

/// One statement and its parameters. Its text is a constant, or made for a group
/// (`writes.rs`'s one statement for a group's writes).
pub(super) struct Sql {
    pub text: Cow<'static, str>,
    pub params: Vec<Param>,
}

/// `sql!(TEXT, a, b)`: a statement with its parameters, each moved into a box.
macro_rules! sql {
    ($text:expr $(, $param:expr)* $(,)?) => {
        $crate::postgres::pipeline::Sql { text: ::std::borrow::Cow::Borrowed($text), params: vec![$(Box::new($param) as $crate::postgres::pipeline::Param),*] }
    };
}
pub(super) use sql;

/// What one statement of a round answered.
pub(super) type Answer = Result<Vec<Row>, Error>;

/// Sends `statements` in order without waiting between them, and collects every answer, in order.
/// The first use of a statement on a connection prepares it first (cached per connection; the
/// preparations of one round are sent together too), so a connection's first rounds cost one more
/// round trip.
///
/// `Err((i, e))`: statement `i` was not sent (its preparation failed, its parameters could not be
/// encoded, the connection was gone), and no statement after it was sent either, so that a
/// COMMIT never follows a write that did not run. The statements before it may have run: the
/// caller must end the transaction or drop the connection.
pub(super) async fn round(
    client: &deadpool_postgres::Client,
    statements: &[Sql],
) -> Result<Vec<Answer>, (usize, Error)> {
    let prepared = in_order(statements.iter().map(|s| client.prepare_cached(&s.text)).collect()).await;
    let mut ready = Vec::with_capacity(prepared.len());
    for (i, prepared) in prepared.into_iter().enumerate() {
        ready.push(prepared.map_err(|e| (i, e))?);
    }
    let queries = statements.iter().zip(ready).map(|(statement, prepared)| async move {
        let params: Vec<&(dyn ToSql + Sync)> =
            statement.params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
        client.query(&prepared, &params).await
    });
    let mut queries: Vec<Pin<Box<MaybeDone<_>>>> = queries.map(|f| Box::pin(maybe_done(f))).collect();
    // Each query sends its request on its first poll, before it could have an answer: one that is
    // over at its first poll with an error was never sent, and the ones after it are not polled.
    let unsent = std::future::poll_fn(|cx| {
        for (i, query) in queries.iter_mut().enumerate() {
            if query.as_mut().poll(cx).is_ready()
                && let Some(Err(_)) = query.as_mut().output_mut()
            {
                return Poll::Ready(Some(i));
            }
        }
        Poll::Ready(None)
    })
    .await;
    if let Some(i) = unsent
        && let Some(Err(e)) = queries[i].as_mut().take_output()
    {
        return Err((i, e));
    }
    std::future::poll_fn(|cx| {
        let mut all = true;
        for query in &mut queries {
            all &= query.as_mut().poll(cx).is_ready();
        }
        if all { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    Ok(queries.iter_mut().filter_map(|query| query.as_mut().take_output()).collect())
}

/// Runs `futures` together, first polling each once in the order given, and answers their
/// outputs in the same order.
async fn in_order<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<MaybeDone<F>>>> = futures.into_iter().map(|f| Box::pin(maybe_done(f))).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for future in &mut futures {
            all &= future.as_mut().poll(cx).is_ready();
        }
        if all { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    futures.iter_mut().filter_map(|future| future.as_mut().take_output()).collect()
}

/// The statement that takes the advisory locks `locks` (id, exclusive: else shared) in ascending
/// order of id, each once (`db::LOCK_MODES`).
pub(super) fn lock_all(locks: Vec<(i64, bool)>) -> Sql {
    let (ids, exclusive) = super::db::ordered(locks);
    sql!(super::db::LOCK_MODES, ids, exclusive)
}
