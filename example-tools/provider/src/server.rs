//! The loopback HTTP/1.1 server: accepting connections, serving each with hyper,
//! and stopping.
//!
//! A `LoseResponse` fault is carried out here: the service future returns an
//! error, and hyper then drops the connection without writing a response. The
//! client has sent its whole request and sees the connection close, which is
//! exactly the "did it happen or not?" situation idempotency keys exist for.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use crate::Provider;
use crate::effects::Reply;
use crate::routes;

/// The service's error for a deliberately lost response; hyper closes the
/// connection when it sees it.
#[derive(Debug, thiserror::Error)]
#[error("response deliberately lost (LoseResponse fault)")]
struct ResponseLost;

/// A running server. Dropping it stops the server.
#[derive(Debug)]
pub(crate) struct Server {
    addr: SocketAddr,
    /// Dropping the sender is the stop signal, so this works from `Drop` without a runtime.
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Server {
    /// Binds `127.0.0.1:port` (0 picks a free port) and serves `provider` on the
    /// current tokio runtime.
    pub(crate) async fn start(port: u16, provider: Arc<Provider>) -> std::io::Result<Server> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, provider, stopped));
        Ok(Server { addr, stop: Mutex::new(Some(stop)), task: Mutex::new(Some(task)) })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, aborts open connections, and waits until the port is released.
    pub(crate) async fn shutdown(&self) {
        drop(lock(&self.stop).take());
        let task = lock(&self.task).take();
        if let Some(task) = task
            && let Err(err) = task.await
        {
            tracing::warn!(%err, "provider accept loop ended abnormally");
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Both guarded values are plain `Option`s that a `take` leaves valid.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn accept_loop(listener: TcpListener, provider: Arc<Provider>, mut stopped: oneshot::Receiver<()>) {
    // Owning the connection tasks lets shutdown end them too, so a stopped
    // provider really is gone rather than still finishing a delayed response.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    connections.spawn(serve_connection(stream, Arc::clone(&provider)));
                }
                Err(err) => {
                    // Typically out of file descriptors: back off instead of spinning.
                    tracing::warn!(%err, "provider failed to accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
}

async fn serve_connection(stream: TcpStream, provider: Arc<Provider>) {
    // Small request/response exchanges: do not let Nagle hold them back.
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(%err, "could not set TCP_NODELAY");
    }
    let service = service_fn(move |request| {
        let provider = Arc::clone(&provider);
        async move {
            match routes::dispatch(&provider, request).await {
                Reply::Send(response) => Ok(response),
                Reply::Lose => Err(ResponseLost),
            }
        }
    });
    let served = http1::Builder::new()
        // With a timer, hyper's header-read timeout applies, so a stalled client
        // cannot hold a connection open forever.
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(err) = served {
        // Includes every deliberately lost response; worth a trace, not a warning.
        tracing::debug!(%err, "provider connection ended with an error");
    }
}
