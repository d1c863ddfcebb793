//! See tests/integration.
