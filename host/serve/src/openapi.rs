//! `/openapi.json`: the HTTP API as OpenAPI 3.1, written out by hand beside the routes in
//! `api.rs` (the `serve` tests generate requests from it and check every answer against it).

use serde_json::{Value, json};

pub fn document() -> Value {
    let error = json!({ "$ref": "#/components/schemas/Error" });
    let refusals = |codes: &[&str]| -> Value {
        let mut map = serde_json::Map::new();
        for code in codes.iter().chain(&["403"]) {
            let description = match *code {
                "400" => {
                    "Malformed JSON, a missing or unknown field, args the tool's schema refuses, a run or step id that is \
                     empty, too long or holds a control character, or a second or non-ASCII Host or Origin."
                }
                "401" => {
                    "A token is needed: the operator's for decisions; beyond loopback, the callers' (or the \
                     operator's) for everything else."
                }
                "403" => {
                    "Refused as a browser's cross-site request: another site's Origin, or a Host that is not this \
                     server (or none)."
                }
                "415" => "A body that is not `Content-Type: application/json`.",
                "404" => "No such tool, operation, run or request for approval.",
                "409" => {
                    "The decision does not apply (wrong fingerprint, already decided, not in doubt), or another \
                     decision won a race (the message says whose)."
                }
                "413" => "The body is too large.",
                "503" => {
                    "The server is stopping, or too many calls run, or it is at its connection limit (nothing of this \
                     one was recorded)."
                }
                _ => "Error.",
            };
            map.insert(
                code.to_string(),
                json!({ "description": description, "content": { "application/json": { "schema": error } } }),
            );
        }
        Value::Object(map)
    };
    let ok = |description: &str, schema: Value, mut errors: Value| -> Value {
        errors["200"] = json!({ "description": description, "content": { "application/json": { "schema": schema } } });
        errors
    };
    let path_param = |name: &str, description: &str| json!({ "name": name, "in": "path", "required": true, "description": description, "schema": { "type": "string" } });
    let header = |name: &str, description: &str| json!({ "name": name, "in": "header", "required": false, "description": description, "schema": { "type": "string" } });
    let trace = [
        header(
            "traceparent",
            "The caller's W3C trace context: the call's span is its child, and each HTTP effect sends its own context downstream (docs/operating.md, Traces).",
        ),
        header("tracestate", "The W3C tracestate that goes with `traceparent`."),
    ];
    let object = json!({ "type": "object" });
    let key = path_param("key", "The operation key.");
    let run_id = path_param("run_id", "The run id.");
    let body = |schema: &str| json!({ "required": true, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } } });
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "oncebox",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Calls of sandboxed agent tools in which every side effect happens once. Identity (`run_id`, `step_id`) comes from the orchestrator's durable state, never from the model."
        },
        "paths": {
            "/v1/calls": { "post": {
                "operationId": "call",
                "summary": "Call a tool for one step of a run (or, for a read-only tool, outside any run).",
                "parameters": trace,
                "requestBody": body("CallRequest"),
                "responses": ok("The outcome, the same JSON object `oncebox call` prints. A failed tool is an outcome, not an error.",
                    json!({ "$ref": "#/components/schemas/Outcome" }), refusals(&["400", "401", "404", "413", "415", "503"]))
            }},
            "/v1/tools": { "get": {
                "operationId": "tools", "summary": "The loaded tools, and the files that did not load.",
                "responses": ok("Tools.", object.clone(), refusals(&["401"]))
            }},
            "/v1/operations/{key}": { "get": {
                "operationId": "operation", "summary": "An operation with its effects and attempts.",
                "parameters": [key],
                "responses": ok("The operation.", object.clone(), refusals(&["401", "404"]))
            }},
            "/v1/operations/{key}/resolve": { "post": {
                "operationId": "resolve", "summary": "Settle by hand an operation whose outcome is unknown (operator token).",
                "parameters": [key], "requestBody": body("Resolve"),
                "responses": ok("The operation's outcome after the settlement.", json!({ "$ref": "#/components/schemas/Outcome" }), refusals(&["400", "401", "404", "409", "413", "415"]))
            }},
            "/v1/operations/{key}/undone-by-hand": { "post": {
                "operationId": "undoneByHand", "summary": "Record that a person undid a completed compensatable step by hand (operator token): its compensation then counts it undone and dispatches nothing for it. Refused (409) while the step's compensation is unknown, in progress or awaiting approval, or once it completed.",
                "parameters": [key], "requestBody": body("UndoneByHand"),
                "responses": ok("The word as recorded (`recorded: false`: one was on record already, and this is it).", object.clone(), refusals(&["400", "401", "404", "409", "413", "415"]))
            }},
            "/v1/runs/{run_id}": { "get": {
                "operationId": "run", "summary": "A run's operations, what keeps it open (`open`: the ledger's one rule), what a person must decide, and what retention removed of it (`expired`: its tombstones).",
                "parameters": [run_id],
                "responses": ok("The run.", object.clone(), refusals(&["401", "404"]))
            }},
            "/v1/runs/{run_id}/reconcile": { "post": {
                "operationId": "reconcile", "summary": "Ask each tool's authority what became of the run's unknown steps.",
                "parameters": [run_id],
                "responses": ok("One answer per unknown step.", object.clone(), refusals(&["401"]))
            }},
            "/v1/runs/{run_id}/compensate": { "post": {
                "operationId": "compensate", "summary": "Undo the run's completed compensatable steps, in reverse order, each once (operator token: it sends refunds).",
                "parameters": [run_id],
                "responses": ok("The saga's report.", object.clone(), refusals(&["401"]))
            }},
            "/v1/runs": { "get": {
                "operationId": "runs",
                "summary": "The runs the ledger knows, one page at a time, in key order (the run ids' byte order): at most `limit` (default 50, at most 500) after the cursor `after` (the `next` of the previous page, opaque; absent for the first). `next` is null on the last page.",
                "parameters": [
                    { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 500 } },
                    { "name": "after", "in": "query", "required": false, "schema": { "type": "string" } }
                ],
                "responses": ok("A page of runs and the next page's cursor.", object.clone(), refusals(&["400", "401"]))
            }},
            "/v1/approvals": { "get": {
                "operationId": "approvals", "summary": "Requests for approval.",
                "parameters": [
                    { "name": "run", "in": "query", "required": false, "schema": { "type": "string" } },
                    { "name": "pending", "in": "query", "required": false, "schema": { "type": "boolean" } }
                ],
                "responses": ok("Requests.", object.clone(), refusals(&["400", "401"]))
            }},
            "/v1/approvals/{key}": { "get": {
                "operationId": "approval", "summary": "A request for approval with its exact params (sensitive values masked).",
                "parameters": [key],
                "responses": ok("The request.", object.clone(), refusals(&["401", "404"]))
            }},
            "/v1/approvals/{key}/approve": { "post": {
                "operationId": "approve", "summary": "Approve the exact params whose fingerprint is given (operator token).",
                "parameters": [key], "requestBody": body("Decide"),
                "responses": ok("The decision.", object.clone(), refusals(&["400", "401", "409", "413", "415"]))
            }},
            "/v1/approvals/{key}/reject": { "post": {
                "operationId": "reject", "summary": "Reject the params whose fingerprint is given (operator token).",
                "parameters": [key], "requestBody": body("Decide"),
                "responses": ok("The decision.", object.clone(), refusals(&["400", "401", "409", "413", "415"]))
            }},
            "/healthz": { "get": {
                "operationId": "healthz", "summary": "Liveness: 200 while taking calls, 503 while stopping.",
                "responses": ok("Serving.", object.clone(), refusals(&["503"]))
            }},
            "/metrics": { "get": {
                "operationId": "metrics", "summary": "Prometheus text format.",
                "responses": {
                    "200": { "description": "Metrics.", "content": { "text/plain": { "schema": { "type": "string" } } } },
                    "401": { "description": "The operator's token is needed.", "content": { "application/json": { "schema": error } } }
                }
            }}
        },
        "components": {
            "securitySchemes": { "operator": { "type": "http", "scheme": "bearer" } },
            "schemas": {
                "Error": {
                    "type": "object", "required": ["error"],
                    "properties": { "error": { "type": "object", "required": ["kind", "message"],
                        "properties": { "kind": { "type": "string" }, "message": { "type": "string" } } } }
                },
                "CallRequest": {
                    "type": "object", "required": ["tool", "args"], "additionalProperties": false,
                    "dependentRequired": { "run_id": ["step_id"], "step_id": ["run_id"] },
                    "properties": {
                        "run_id": { "type": "string", "description": "From the orchestrator's durable state; with step_id." },
                        "step_id": { "type": "string", "description": "Stable across retries of this step." },
                        "tool": { "type": "string" },
                        "args": { "type": "object" },
                        "wait": { "type": ["number", "null"], "minimum": 0, "maximum": 300, "description": "Seconds to wait for another caller's result of the step." }
                    }
                },
                "Outcome": {
                    "type": "object", "required": ["status", "replayed", "attempts"],
                    "properties": {
                        "status": { "enum": ["completed", "failed", "unknown", "conflict", "in-progress", "awaiting-approval", "rejected", "expired"] },
                        "replayed": { "type": "boolean" },
                        "attempts": { "type": "integer", "minimum": 0 },
                        "operation_key": { "type": ["string", "null"] },
                        "output": {},
                        "error": { "type": "object" },
                        "fingerprint": { "type": "string" },
                        "approval": { "type": "object" }
                    }
                },
                "Decide": {
                    "type": "object", "required": ["fingerprint", "by"], "additionalProperties": false,
                    "properties": {
                        "fingerprint": { "type": "string", "minLength": 1 },
                        "component": { "type": ["string", "null"], "description": "The digest of the component the request names, as shown: required to approve; refused if it changed since." },
                        "by": { "type": "string", "pattern": "\\S", "description": "Who decides (recorded)." },
                        "note": { "type": ["string", "null"] },
                        "expires_in": { "type": ["number", "null"], "minimum": 0, "maximum": 31622400, "description": "Approve only for this many seconds (at most 366 days)." }
                    }
                },
                "UndoneByHand": {
                    "type": "object", "required": ["by"], "additionalProperties": false,
                    "properties": { "by": { "type": "string", "pattern": "\\S" }, "note": { "type": ["string", "null"] } }
                },
                "Resolve": {
                    "type": "object", "required": ["by"], "additionalProperties": false,
                    "description": "Exactly one of `committed` (not null) and `not_committed: true`.",
                    "properties": {
                        "committed": { "not": { "type": "null" }, "description": "It took place: its output." },
                        "not_committed": { "type": "boolean" },
                        "effect": { "type": ["string", "null"] },
                        "by": { "type": "string", "pattern": "\\S" }, "note": { "type": ["string", "null"] }
                    },
                    "oneOf": [
                        { "required": ["committed"], "properties": { "not_committed": { "const": false } } },
                        { "required": ["not_committed"], "not": { "required": ["committed"] }, "properties": { "not_committed": { "const": true } } }
                    ]
                }
            }
        }
    })
}
