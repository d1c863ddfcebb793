//! oncebox's integration tests: real components (built by `oncebox-artifacts`), a real redb file
//! in a temporary directory, and the real example provider on loopback. Effects are counted where
//! they land: the provider's own count, the ledger's own KV and outbox.

mod support;

mod approval_binding;
mod approvals;
mod args;
mod cli;
mod clients;
mod concurrency;
mod conformance;
mod docs;
mod effects;
mod guarantee;
mod harness;
mod kill;
mod languages;
mod ledger_model;
mod loading;
mod multihost;
mod open_index;
mod outbox;
mod pg;
mod reconciler;
mod recovery;
mod replay;
mod retention;
mod retries;
mod retry_matrix;
mod saga;
mod saga_in_flight;
mod sandbox;
mod secrets;
mod serve;
mod storage;
mod tls;
