// @oncebox/tool: write oncebox tools in JavaScript. See ../README.md and ../index.d.ts.
export { defineTool, committed, NOT_COMMITTED, STILL_UNKNOWN, lookup, Reconciliation, CLASSES } from './tool.js';
export { http, kv, outbox, provider, operationKey, config, HttpResponse, Namespace, ABSENT, UPDATE_TRIES } from './api.js';
export { ToolError, Transient, Permanent, RateLimited, MayHaveCommitted, UnknownOutcome, isToolError } from './errors.js';
