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
    /// Any 2xx: 200, 201 Created, 202 Accepted, 204 No Content. Never compare with `200` alone: a
    /// downstream that answers 201 would have its every commit recorded as a failure.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as `T` when the status is any 2xx; any other status the tool sees (3xx, or a 4xx
    /// refusal: the host turns 408, 409, 429 and 5xx into errors before the tool sees them) is a
    /// permanent error naming it. Check the statuses that mean something to your tool (402: card
    /// declined) before calling this.
    pub fn json_if_success<T: DeserializeOwned>(&self) -> Result<T, ToolError> {
        if self.is_success() {
            return self.json();
        }
        let body = String::from_utf8_lossy(&self.body);
        let body: String = body.chars().take(200).collect();
        Err(ToolError::permanent(format!("the downstream answered {}: {body}", self.status)))
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
/// `[tools.NAME.grants]`). Writes commit in the same transaction as their record, and only if the
/// attempt completes (a failed attempt's writes are discarded).
///
/// Reads return a [`kv::Version`], and [`kv::Namespace::set_if`] writes only if the key still has
/// it: a read-modify-write of a key that other steps write too (a counter, a stock level) must use
/// it, or two steps that read the same value both write their sum and one update is lost.
/// [`kv::Namespace::update_json`] does the whole loop.
pub mod kv {
    use super::*;

    /// A KV namespace: the tool's own, or one granted to it.
    #[derive(Debug, Clone, Copy)]
    pub struct Namespace<'a>(Option<&'a str>);

    /// A key's version: it changes with every committed write of the key. Opaque: compare it,
    /// never order it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Version(u64);

    impl Version {
        /// The version of a key that does not exist: `set_if(.., Version::ABSENT)` creates a key
        /// only if nobody else has.
        pub const ABSENT: Version = Version(0);
    }

    /// How often [`Namespace::update_json`] reads again after another write came first.
    pub const UPDATE_TRIES: u32 = 16;

    /// Another namespace, shared with the tools it is granted to.
    pub const fn namespace(name: &str) -> Namespace<'_> {
        Namespace(Some(name))
    }

    const OWN: Namespace<'static> = Namespace(None);

    impl Namespace<'_> {
        pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, ToolError> {
            Ok(self.get_versioned(key)?.0)
        }

        /// The value and its version ([`Version::ABSENT`] when there is none).
        pub fn get_versioned(&self, key: &str) -> Result<(Option<Vec<u8>>, Version), ToolError> {
            Ok(match reads::kv_get(self.0, key)? {
                Some(entry) => (Some(entry.value), Version(entry.version)),
                None => (None, Version::ABSENT),
            })
        }

        /// Reads a JSON value; a value that does not parse is a permanent error.
        pub fn get_json<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ToolError> {
            Ok(self.get_json_versioned(key)?.0)
        }

        /// Reads a JSON value and its version.
        pub fn get_json_versioned<T: DeserializeOwned>(&self, key: &str) -> Result<(Option<T>, Version), ToolError> {
            let (bytes, version) = self.get_versioned(key)?;
            let value = bytes.map(|bytes| serde_json::from_slice(&bytes)).transpose()?;
            Ok((value, version))
        }

        pub fn set(&self, label: &str, key: &str, value: &[u8]) -> Result<(), ToolError> {
            effects::kv_set(label, self.0, key, value)
        }

        pub fn set_json<T: Serialize>(&self, label: &str, key: &str, value: &T) -> Result<(), ToolError> {
            self.set(label, key, &serde_json::to_vec(value)?)
        }

        /// Writes `value` only if the key still has `version`; `Ok(false)` if another write came
        /// first (nothing was written: read again and decide again).
        pub fn set_if(&self, label: &str, key: &str, value: &[u8], version: Version) -> Result<bool, ToolError> {
            effects::kv_set_if(label, self.0, key, value, version.0)
        }

        pub fn set_json_if<T: Serialize>(
            &self,
            label: &str,
            key: &str,
            value: &T,
            version: Version,
        ) -> Result<bool, ToolError> {
            self.set_if(label, key, &serde_json::to_vec(value)?, version)
        }

        /// Read-modify-write without lost updates: reads the key, computes its new value with
        /// `update` (given the current one, if any), and writes it only if nobody wrote the key in
        /// between, reading again if somebody did. Returns the value written.
        pub fn update_json<T: Serialize + DeserializeOwned>(
            &self,
            label: &str,
            key: &str,
            mut update: impl FnMut(Option<T>) -> Result<T, ToolError>,
        ) -> Result<T, ToolError> {
            for _ in 0..UPDATE_TRIES {
                let (current, version) = self.get_json_versioned::<T>(key)?;
                let next = update(current)?;
                if self.set_json_if(label, key, &next, version)? {
                    return Ok(next);
                }
            }
            Err(ToolError::transient(format!("kv: `{key}` kept changing under concurrent writes")))
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

    pub fn update_json<T: Serialize + DeserializeOwned>(
        label: &str,
        key: &str,
        update: impl FnMut(Option<T>) -> Result<T, ToolError>,
    ) -> Result<T, ToolError> {
        OWN.update_json(label, key, update)
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
