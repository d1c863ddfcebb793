//! The one HTTP client of a host: every HTTP effect and read, and the outbox relay's deliveries.

use crate::error::Error;

/// Installs the process's TLS crypto provider (rustls with ring), which every HTTP client of the
/// process needs before it is built: the host's, and the trace exporter's. One per process; a
/// second install (another host) is refused harmlessly.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The client every HTTP effect and read goes through (and the outbox relay's deliveries).
pub(crate) fn build(tls_roots: &[Vec<u8>]) -> Result<reqwest::Client, Error> {
    install_crypto_provider();
    // Redirects are answers, not instructions: following one would send the effect (and its key
    // and credentials) to a host nobody configured. The tool sees the 3xx instead.
    let mut builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    for pem in tls_roots {
        let certificate = reqwest::Certificate::from_pem(pem)
            .map_err(|e| Error::HttpClient(format!("a trusted TLS root is not a PEM certificate: {e}")))?;
        builder = builder.add_root_certificate(certificate);
    }
    builder.build().map_err(|e| Error::HttpClient(e.to_string()))
}
