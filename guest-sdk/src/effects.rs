//! Effects and reads as plain Rust functions over the contract's imports.
//!
//! Every function taking a `label` is an effect: the host derives its key from the operation, the
//! label and how many times this invocation used the label, records it before and after dispatch,
//! and answers it from the record when the operation runs again. Give each logical effect its own
//! label ("charge", "send-receipt").

use serde::{Serialize, de::DeserializeOwned};

use crate::ToolError;
pub use crate::bindings::oncebox::tool::effects::HttpRequest;
pub use crate::bindings::oncebox::tool::types::HttpResponse;
use crate::bindings::oncebox::tool::{config as wit_config, effects, reads};

impl HttpResponse {
    /// 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body parsed as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ToolError> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    /// The first header with this name, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// HTTP: reads (`get`) and effects (`post_json`, `send`).
pub mod http {
    use super::*;

    /// A side-effect-free GET. No ledger entry.
    pub fn get(url: &str) -> Result<HttpResponse, ToolError> {
        reads::http_get(url, &[])
    }

    /// An HTTP effect with a JSON body. The host adds `Idempotency-Key`.
    pub fn post_json<T: Serialize>(label: &str, url: &str, body: &T) -> Result<HttpResponse, ToolError> {
        send(
            label,
            &HttpRequest {
                method: "POST".into(),
                url: url.into(),
                headers: vec![("content-type".into(), "application/json".into())],
                body: serde_json::to_vec(body)?,
            },
        )
    }

    /// Any HTTP effect.
    pub fn send(label: &str, request: &HttpRequest) -> Result<HttpResponse, ToolError> {
        effects::http(label, request)
    }
}

/// Durable key-value state. The free functions use the tool's own namespace (named after the
/// tool); [`kv::namespace`] reaches another, which the operator must grant (`kv = ["name"]` under
/// `[tools.NAME.grants]`). Writes commit in the same transaction as their record.
pub mod kv {
    use super::*;

    /// A KV namespace: the tool's own, or one granted to it.
    #[derive(Debug, Clone, Copy)]
    pub struct Namespace<'a>(Option<&'a str>);

    /// Another namespace, shared with the tools it is granted to.
    pub const fn namespace(name: &str) -> Namespace<'_> {
        Namespace(Some(name))
    }

    const OWN: Namespace<'static> = Namespace(None);

    impl Namespace<'_> {
        pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, ToolError> {
            reads::kv_get(self.0, key)
        }

        /// Reads a JSON value; a value that does not parse is a permanent error.
        pub fn get_json<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ToolError> {
            self.get(key)?.map(|bytes| serde_json::from_slice(&bytes)).transpose().map_err(Into::into)
        }

        pub fn set(&self, label: &str, key: &str, value: &[u8]) -> Result<(), ToolError> {
            effects::kv_set(label, self.0, key, value)
        }

        pub fn set_json<T: Serialize>(&self, label: &str, key: &str, value: &T) -> Result<(), ToolError> {
            self.set(label, key, &serde_json::to_vec(value)?)
        }

        pub fn delete(&self, label: &str, key: &str) -> Result<(), ToolError> {
            effects::kv_delete(label, self.0, key)
        }
    }

    pub fn get(key: &str) -> Result<Option<Vec<u8>>, ToolError> {
        OWN.get(key)
    }

    pub fn get_json<T: DeserializeOwned>(key: &str) -> Result<Option<T>, ToolError> {
        OWN.get_json(key)
    }

    pub fn set(label: &str, key: &str, value: &[u8]) -> Result<(), ToolError> {
        OWN.set(label, key, value)
    }

    pub fn set_json<T: Serialize>(label: &str, key: &str, value: &T) -> Result<(), ToolError> {
        OWN.set_json(label, key, value)
    }

    pub fn delete(label: &str, key: &str) -> Result<(), ToolError> {
        OWN.delete(label, key)
    }
}

/// Messages for later delivery, enqueued in the same transaction as their record.
pub mod outbox {
    use super::*;

    pub fn send<T: Serialize>(label: &str, topic: &str, payload: &T) -> Result<(), ToolError> {
        effects::outbox(label, topic, &serde_json::to_vec(payload)?)
    }
}

/// Calls an effect provider the embedder registered under `name`, with JSON in and out.
pub fn provider<T: Serialize, R: DeserializeOwned>(label: &str, name: &str, request: &T) -> Result<R, ToolError> {
    let response = effects::provider(label, name, &serde_json::to_string(request)?)?;
    Ok(serde_json::from_str(&response)?)
}

/// The key the host derived for this operation (for tools that must put it in a body or a URL).
pub fn operation_key() -> String {
    effects::operation_key()
}

/// An operator-supplied setting; never from the model's args.
pub fn config(key: &str) -> Option<String> {
    wit_config::get(key)
}
