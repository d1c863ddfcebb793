//! What `export!` expands to calls into. Not part of the API.

pub use crate::bindings;
pub use crate::bindings::oncebox::tool::types::Manifest;
pub use wit_bindgen;

use crate::{ReplayClass, Tool, ToolError, tool::Reconcile, tool::Reconciliation};

/// `Reconciliation` with the output already serialized.
pub enum Reconciled {
    Committed(String),
    NotCommitted,
    StillUnknown,
}

pub fn manifest<T: Tool>(class: ReplayClass, version: &str) -> Manifest {
    let schema = schemars::schema_for!(T::Args);
    Manifest {
        name: T::NAME.into(),
        version: version.into(),
        description: T::DESCRIPTION.into(),
        class,
        input_schema: serde_json::to_string(&schema).unwrap_or_else(|_| "{}".into()),
        compensated_by: T::COMPENSATED_BY.map(Into::into),
        compensation_args: T::COMPENSATION_ARGS
            .iter()
            .map(|(arg, pointer)| ((*arg).into(), (*pointer).into()))
            .collect(),
        consequence: T::CONSEQUENCE.map(Into::into),
        sensitive: T::SENSITIVE.iter().map(|s| (*s).into()).collect(),
    }
}

fn parse_args<T: Tool>(args: &str) -> Result<T::Args, ToolError> {
    // The host validated the args against the schema already; a failure here means the schema and
    // the type disagree, which retrying cannot fix.
    serde_json::from_str(args).map_err(|e| ToolError::permanent(format!("invalid args: {e}")))
}

pub fn invoke<T: Tool>(args: &str) -> Result<String, ToolError> {
    let output = T::invoke(parse_args::<T>(args)?)?;
    Ok(serde_json::to_string(&output)?)
}

pub fn reconcile<T: Reconcile>(effect_key: &str, args: &str) -> Reconciled {
    let Ok(args) = parse_args::<T>(args) else {
        return Reconciled::StillUnknown;
    };
    match T::reconcile(effect_key, args) {
        Reconciliation::Committed(output) => match serde_json::to_string(&output) {
            Ok(json) => Reconciled::Committed(json),
            Err(_) => Reconciled::StillUnknown,
        },
        Reconciliation::NotCommitted => Reconciled::NotCommitted,
        Reconciliation::StillUnknown => Reconciled::StillUnknown,
    }
}
