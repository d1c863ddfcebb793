//! HTTPS effects: the key and the operator's credentials travel over TLS to a downstream whose
//! certificate the host trusts, and a certificate it does not trust gets nothing at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use oncebox::{Call, Host, HttpTarget, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A one-route HTTPS payments server on loopback: answers every POST with a payment, and counts
/// the requests that reached it with an `Idempotency-Key`.
struct TlsServer {
    port: u16,
    cert_pem: String,
    keyed_requests: Arc<AtomicU64>,
}

async fn tls_server() -> TlsServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let keyed_requests = Arc::new(AtomicU64::new(0));
    let counter = keyed_requests.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(socket).await else { return };
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // Headers, then as much body as content-length says.
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
                            .unwrap_or(0usize);
                        if request.len() >= end + 4 + length {
                            if text.contains("idempotency-key:") {
                                counter.fetch_add(1, Ordering::SeqCst);
                            }
                            break;
                        }
                    }
                }
                let body = r#"{"id":"pay_tls","order_id":"o-1","amount_cents":1200,"status":"succeeded"}"#;
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    TlsServer { port, cert_pem: certified.cert.pem(), keyed_requests }
}

async fn host(server: &TlsServer, trust: bool) -> Host {
    let mut builder = Host::builder_in_memory()
        .tool_config("charge", "base_url", format!("https://localhost:{}", server.port))
        .grant("charge", oncebox::Grant::Http(format!("https://localhost:{}", server.port).parse().expect("origin")))
        .http_target(format!("localhost:{}", server.port), HttpTarget { honours_keys: true, ..Default::default() })
        .retry_policy("charge", crate::support::fast(oncebox::ReplayClass::Compensatable));
    if trust {
        builder = builder.tls_root_certificate(server.cert_pem.as_bytes());
    }
    let host = builder.build().await.expect("host");
    host.load(oncebox_artifacts::CHARGE).await.expect("load");
    host
}

#[tokio::test]
async fn an_https_effect_reaches_a_trusted_downstream_with_its_key() {
    let server = tls_server().await;
    let host = host(&server, true).await;
    let outcome = host
        .call(Call::step("run-1", "charge", "charge", crate::support::charge("o-1").to_string()))
        .await
        .expect("call");
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(outcome.output.expect("output")["id"], "pay_tls");
    assert_eq!(server.keyed_requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_untrusted_certificate_gets_nothing() {
    let server = tls_server().await;
    let host = host(&server, false).await;
    let outcome = host
        .call(Call::step("run-1", "charge", "charge", crate::support::charge("o-1").to_string()))
        .await
        .expect("call");
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(outcome.error.expect("error").class, "transient", "the handshake failed: nothing was sent");
    assert_eq!(server.keyed_requests.load(Ordering::SeqCst), 0);
}
