//! The HTTP listener: what a connection may hold before it is dropped. `axum::serve` gives hyper
//! no timer, so a client that sends half a request, or nothing, keeps its connection (and a file
//! descriptor) for as long as it likes; enough of them and nobody is answered. Here:
//!
//! - a request's head must arrive within `header_timeout` of the connection going idle (hyper's
//!   header-read timeout starts again after each answer, so it bounds keep-alive idleness too: a
//!   proxy's pool of upstream connections should keep them idle for less, or a POST it sends on
//!   one the server is closing comes back 502);
//! - a request's body must arrive within `body_timeout`, and be at most `max_body` bytes, on every
//!   route (`/mcp`'s SDK reads its own bodies, so the limit is applied before it);
//! - at most `max_connections` connections are open at once; one beyond them is answered 503 and
//!   closed, so `/healthz` and the operator are answered again as soon as a slot frees.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::CONTENT_LENGTH;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::error::ApiError;

/// How long a request's head may take, from the moment its connection is idle (`--header-timeout`).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request's body may take to arrive, once its head has.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The open connections a server takes by default (`--max-connections`).
pub const MAX_CONNECTIONS: usize = 4096;
/// The largest request body by default (`--max-body`).
pub const MAX_BODY: usize = 1 << 20;
/// Connections beyond the cap answered 503 at once; more than these are closed without a word,
/// so that a flood cannot spend the descriptors the ledger and the downstreams need.
const REFUSING: usize = 64;

/// What one server's connections may hold.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_body: usize,
}

impl Default for ConnectionLimits {
    /// `oncebox serve`'s defaults: the constants above, and a body of at most 1 MiB.
    fn default() -> Self {
        ConnectionLimits {
            max_connections: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            max_body: MAX_BODY,
        }
    }
}

/// Serves `router` on `listener` until `shutdown`, then lets the open connections finish the
/// requests they carry (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let refusing = Arc::new(tokio::sync::Semaphore::new(REFUSING));
    let mut warned: Option<tokio::time::Instant> = None;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // A connection reset before it was taken: nothing to wait for. Out of file
                    // descriptors: the listener itself is fine, and one frees as connections
                    // close. Said once a second at most.
                    if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                        tracing::warn!(error = %e, "accepting a connection");
                        warned = Some(tokio::time::Instant::now());
                    }
                    let per_connection = matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                    );
                    if !per_connection {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if let Ok(refusal) = refusing.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream, limits.max_connections).await;
                    drop(refusal);
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A connection's end is the client's business (a reset, a timeout): nothing to report.
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Answers a connection beyond the cap with 503 and closes it, within a second whatever the
/// client does. The request's head is read first: an HTTP client treats an answer that comes
/// before its request as a broken connection, not as the server's word.
async fn refuse(mut stream: TcpStream, max: usize) {
    let refused = ApiError::Full(format!(
        "this server has {max} connections open, its limit (--max-connections); nothing was done: try again shortly"
    ));
    let body = refused.body().to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: \
         close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut head = Vec::with_capacity(1024);
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            match stream.read(&mut buf).await? {
                0 => break,
                n => head.extend_from_slice(&buf[..n]),
            }
        }
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what else the client sent, so that closing does not reset the answer away.
        while stream.read(&mut buf).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Reads a request's whole body within the limits before any route sees it: a body over
/// `max_body` is refused 413, one that does not arrive in time 408.
pub async fn bounded_body(State(limits): State<ConnectionLimits>, request: Request, next: Next) -> Response {
    let max = limits.max_body;
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return too_large(max);
    }
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout(limits.body_timeout, axum::body::to_bytes(body, max)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|cause| cause.is::<http_body_util::LengthLimitError>())
                || e.to_string().contains("length limit");
            if over {
                return too_large(max);
            }
            return ApiError::BadRequest(format!("the request body could not be read: {e}")).into_response();
        }
        Err(_) => {
            let secs = limits.body_timeout.as_secs();
            return ApiError::TimedOut(format!("the request body did not arrive within {secs} s; nothing was done"))
                .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

fn too_large(max: usize) -> Response {
    ApiError::TooLarge(format!("a request body may be at most {max} bytes (--max-body); nothing was done"))
        .into_response()
}
