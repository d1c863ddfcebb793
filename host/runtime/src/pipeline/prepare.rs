//! The first stage: the args validated against the tool's input schema (bad input: a clear
//! error, and nothing recorded) and the keys derived from the orchestrator's ids, never from the
//! model's output.

use serde_json::Value;

use crate::call::{Call, Prepared};
use crate::error::CallError;
use crate::keys;
use crate::runtime::LoadedTool;
use crate::stage::Stage;

/// Validates the args (bad input: a clear error, and nothing recorded) and derives the keys from
/// the orchestrator's ids.
pub(crate) fn prepare(host: &Stage, tool: &LoadedTool, call: Call) -> Result<Prepared, CallError> {
    let name = tool.manifest.name.as_str();
    let args = validate(tool, &call.args)?;
    let (Some(run_id), Some(step_id)) = (call.run_id, call.step_id) else {
        return Err(CallError::StepRequired { tool: name.to_string(), class: tool.manifest.class });
    };
    let canonical_args = keys::canonical_json(&args);
    Ok(Prepared {
        operation_key: keys::operation_key(&run_id, &step_id, name),
        fingerprint: host.shared.keying.fingerprint(name, &canonical_args),
        older_fingerprints: host.shared.keying.older_fingerprints(name, &canonical_args),
        canonical_args,
        args,
        run_id,
        step_id,
        trace: Default::default(),
    })
}

/// Parses and validates args against the manifest's schema.
pub(super) fn validate(tool: &LoadedTool, args: &str) -> Result<Value, CallError> {
    let invalid = |reason: String| CallError::InvalidArgs { tool: tool.manifest.name.clone(), reason };
    let max = tool.sandbox.limits.args_bytes;
    if args.len() > max {
        return Err(invalid(format!("{} bytes, over the limit of {max}", args.len())));
    }
    let value: Value = serde_json::from_str(args).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
    // The yes-or-no check is much cheaper than collecting every error; valid args are the rule.
    if tool.schema.is_valid(&value) {
        return Ok(value);
    }
    // A refusal quotes the value it refuses ("12345678901234 is not of type string"): where the
    // tool has sensitive args (a card number sent as a number, say), no value is quoted at all,
    // since an error at an enclosing object quotes the whole of it, and what is left is scrubbed
    // of the sensitive values all the same. The path still says where.
    let sensitive = &tool.manifest.sensitive;
    let secrets = crate::redact::sensitive_values(&value, sensitive);
    let problems: Vec<String> = tool
        .schema
        .iter_errors(&value)
        .map(|e| {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() { "(root)".to_string() } else { at };
            let problem = if sensitive.is_empty() { e.to_string() } else { e.masked_with(crate::REDACTED).to_string() };
            crate::redact::scrub(&format!("{at} {problem}"), &secrets)
        })
        .collect();
    if !problems.is_empty() {
        return Err(invalid(format!("does not match the input schema: {}", problems.join("; "))));
    }
    Ok(value)
}
