// Type declarations of @oncebox/tool: write oncebox tools in JavaScript.
//
// A tool is one module that calls `defineTool({...})` once, built by `oncebox-js build` (see
// README.md) into a WebAssembly component for its class's WIT world. Effects are plain functions
// (`http`, `kv`, `outbox`, `provider`); the host keys, records and deduplicates each of them, so the
// tool itself never deals with idempotency.
//
// The mistakes the SDK makes hard:
//
// - Only 200 is success. A downstream that answers 201 has done the work. Use
//   `response.isSuccess()` or `response.jsonIfSuccess()` (any 2xx).
// - Calling a lost answer a failure. When the downstream's answer does not say whether the work
//   was done, throw `MayHaveCommitted`: the operation ends `unknown` and is reconciled, never
//   `failed` (which promises that nothing took effect) and never resent blindly. The host already
//   does this for an HTTP effect's 408, 409, 5xx or lost connection.
// - A key that changes between attempts. An effect's key comes from the operation, its `label`
//   and how often the attempt used the label: a label built from the time, a random number or a
//   counter kept outside the args changes the key, and the downstream sees a new request. Labels
//   are constants ("charge", "send-receipt").
// - Turning a bug into an answer. Throw `Permanent`, `Transient`, `RateLimited` or
//   `MayHaveCommitted` to answer; any other exception fails the attempt (a trap, reported by the
//   host with the tool's stderr, where the SDK prints the exception and its stack), never a
//   `permanent` error that would promise nothing took effect.

/** What repeating a tool costs; the host derives its retry policy from it. */
export type ReplayClass = 'read-only' | 'idempotent-write' | 'compensatable' | 'irreversible';

/** The four classes, in the contract's order. */
export const CLASSES: readonly ReplayClass[];

/** JSON as `JSON.parse` returns it. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Headers as pairs (in order, repeats allowed) or as a plain object. */
export type Headers = [string, string][] | Record<string, string>;

// ---- errors ------------------------------------------------------------------------------------

/** The contract's `tool-error` variant, as componentize-js lowers it. */
export type ToolErrorPayload =
  | { tag: 'transient'; val: string }
  | { tag: 'rate-limited'; val: { retryAfterMs: bigint; message: string } }
  | { tag: 'permanent'; val: string }
  | { tag: 'unknown-outcome'; val: string };

/**
 * Base class of the four ways an invocation or an effect can fail. Thrown from `invoke`, it is the
 * invocation's `tool-error`; every failing host call (`http.get`, `http.send`, `kv.*`, ...) throws
 * one, so an uncaught one is passed on as it is (as `?` does in Rust).
 */
export class ToolError extends Error {
  /** transient, rate-limited, permanent or unknown-outcome. */
  readonly kind: ToolErrorPayload['tag'];
  readonly payload: ToolErrorPayload;
}

/** Nothing took effect; another attempt may succeed. */
export class Transient extends ToolError {
  constructor(message: string);
}

/** Invalid input, a rejected payment, missing permission, a business rule: never retried. */
export class Permanent extends ToolError {
  constructor(message: string);
}

/** Nothing took effect; the downstream asked to wait `retryAfterMs`. */
export class RateLimited extends ToolError {
  constructor(retryAfterMs: number | bigint, message: string);
  readonly retryAfterMs: number;
}

/**
 * An effect may have committed but its answer does not say (a provider's 5xx, a `"status":
 * "pending"` that never settles, a body cut short): the operation ends `unknown` and is reconciled
 * through the tool's `reconcile`, never retried blindly and never recorded as `failed`. The
 * contract's `unknown-outcome`. (The host already treats 408, 409 and 5xx answers to HTTP effects
 * this way, before the tool sees them.)
 */
export class MayHaveCommitted extends ToolError {
  constructor(message: string);
}

/** The contract's name for `MayHaveCommitted`. */
export const UnknownOutcome: typeof MayHaveCommitted;

/** Whether `e` is a ToolError (from any copy of the SDK). */
export function isToolError(e: unknown): e is ToolError;

// ---- the tool ----------------------------------------------------------------------------------

/** What the authority says about an effect whose response was lost. See `NOT_COMMITTED`. */
export type Reconciliation<O = any> =
  | { readonly kind: 'committed'; readonly output: O }
  | { readonly kind: 'not-committed' }
  | { readonly kind: 'still-unknown' };

/** The effect took place; `output` is what `invoke` would have returned for the operation. */
export function committed<O>(output: O): Reconciliation<O>;

/**
 * The authority has no record of the effect. Only "no record of it *now*": a downstream still
 * processing the request, or one whose index lags, shows nothing for an effect that will commit.
 * The host counts it as proof only once the downstream's `settle_window` (the operator's setting
 * per host, 5 minutes by default) has passed since the effect's last send ended; before that the
 * operation stays unknown.
 */
export const NOT_COMMITTED: Reconciliation<never>;

/** The authority cannot tell. Not proof of anything. */
export const STILL_UNKNOWN: Reconciliation<never>;

/**
 * Asks an authority that looks effects up by their key (as Stripe-like APIs do): 200 with a JSON
 * body is committed (the body, through `toOutput` if given, is the output); 404 is "no record of it
 * now", which the host counts as not committed only after the settle window; anything else (an
 * error, a 5xx, a body that does not parse, a `toOutput` that throws) proves nothing. The lookup
 * is a read: its URL's origin must be granted to the tool like its effects'
 * (`[tools.NAME.grants] http`).
 */
export function lookup<O = any>(url: string, toOutput?: (body: any) => O): Reconciliation<O>;

/** `committed`, `NOT_COMMITTED`, `STILL_UNKNOWN` and `lookup` in one place. */
export const Reconciliation: {
  readonly committed: typeof committed;
  readonly NOT_COMMITTED: typeof NOT_COMMITTED;
  readonly STILL_UNKNOWN: typeof STILL_UNKNOWN;
  readonly lookup: typeof lookup;
};

/** What `defineTool` takes. `A`: the args (as the schema says); `O`: the output (JSON). */
export interface ToolDefinition<A = any, O = unknown> {
  /** The tool's name, unique within a host. */
  name: string;
  /** One sentence for the model and the operator. */
  description: string;
  /** Must equal package.json's `oncebox.class` (the build checks). */
  class: ReplayClass;
  /**
   * The JSON Schema (an object) the args must satisfy; the host refuses args that do not before
   * the tool runs. Say `additionalProperties: false` to refuse unknown args.
   */
  args: Record<string, unknown>;
  /** The manifest's version; package.json's `version` by default. */
  version?: string;
  /** JSON pointers into the args whose values never appear in logs or records (`/payment_method`). */
  sensitive?: string[];
  /** The tool that undoes this one (compensatable tools). */
  compensatedBy?: string;
  /**
   * How the `compensatedBy` tool's args are made from this operation's: its arg name -> a JSON
   * pointer into `{"args": ..., "output": ...}`. For `charge` undone by `refund`:
   * `{order_id: '/args/order_id', amount_cents: '/output/amount_cents'}`. Pointers may not reach a
   * `sensitive` arg: the ledger keeps those redacted.
   */
  compensationArgs?: Record<string, string> | [string, string][];
  /**
   * For irreversible tools: what running it does that cannot be taken back, in words, shown to the
   * person asked to approve a call ("The shipment leaves the warehouse and cannot be cancelled").
   */
  consequence?: string;
  /**
   * Runs the tool once: returns the output (anything JSON can hold; `undefined` is `null`), or
   * throws a ToolError. May be async; host calls are synchronous.
   */
  invoke(args: A): O | Promise<O>;
  /**
   * Compensatable and irreversible tools (required there, refused elsewhere): asks the authority
   * about the effect sent with `effectKey`, exactly the `Idempotency-Key` header the host sent with
   * it (for a provider effect, the key the provider was given). It runs with the tool's own grants
   * and outside any operation, so an effect it tries is refused: its answer is evidence, not an
   * action. A ToolError thrown here (a failed read) is `STILL_UNKNOWN`.
   */
  reconcile?(effectKey: string, args: A): Reconciliation<O> | Promise<Reconciliation<O>>;
}

/**
 * Declares the component's tool. Call it once, at the top level of the entry module: the build
 * runs the top level, so a mistake in the definition fails the build.
 */
export function defineTool<A = any, O = unknown>(definition: ToolDefinition<A, O>): ToolDefinition<A, O>;

// ---- effects and reads -------------------------------------------------------------------------

/** An HTTP answer. */
export class HttpResponse {
  readonly status: number;
  /** As received, in order. */
  readonly headers: [string, string][];
  readonly body: Uint8Array;
  /**
   * Any 2xx: 200, 201 Created, 202 Accepted, 204 No Content. Never compare with 200 alone: a
   * downstream that answers 201 would have its every commit recorded as a failure.
   */
  isSuccess(): boolean;
  /** The body as UTF-8 text. */
  text(): string;
  /** The body parsed as JSON; a body that does not parse is a `Permanent` error. */
  json<T = any>(): T;
  /**
   * The body as JSON when the status is any 2xx; any other status the tool sees (3xx, or a 4xx
   * refusal: the host turns 408, 409, 429 and 5xx into errors before the tool sees them) is a
   * `Permanent` error naming it. Check the statuses that mean something to your tool (402: card
   * declined) before calling this.
   */
  jsonIfSuccess<T = any>(): T;
  /** The first header with this name, compared case-insensitively. */
  header(name: string): string | undefined;
}

/** An HTTP effect: the host adds `Idempotency-Key`; the tool may not set it, nor `Host`. */
export interface HttpRequest {
  /** POST by default. */
  method?: string;
  url: string;
  headers?: Headers;
  /** Bytes, or a string sent as UTF-8. */
  body?: Uint8Array | string;
}

/**
 * HTTP: reads (`get`) and effects (`postJson`, `send`). Every function taking a `label` is an
 * effect: the host derives its key from the operation, the label and how many times this
 * invocation used the label, records it before and after dispatch, and answers it from the record
 * when the operation runs again. Give each logical effect its own constant label.
 */
export const http: {
  /** A side-effect-free GET to a granted origin. No ledger entry. */
  get(url: string, headers?: Headers): HttpResponse;
  /** An HTTP effect POSTing `body` as JSON. */
  postJson(label: string, url: string, body: unknown): HttpResponse;
  /** Any HTTP effect. */
  send(label: string, request: HttpRequest): HttpResponse;
};

/** A key's version: it changes with every committed write of the key. Opaque: compare it, never
 * order it. */
export type Version = bigint;

/** The version of a key that does not exist: `setIf(..., ABSENT)` creates a key only if nobody
 * else has. */
export const ABSENT: Version;

/** How often `updateJson` reads again after another write came first. */
export const UPDATE_TRIES: number;

/** A KV namespace: the tool's own (`kv` itself) or one granted to it (`kv.namespace(name)`). */
export interface KvNamespace {
  /** The value, or undefined if the key is absent. */
  get(key: string): Uint8Array | undefined;
  /** The value and its version (`ABSENT` when there is none). */
  getVersioned(key: string): { value: Uint8Array | undefined; version: Version };
  /** A JSON value, or undefined; a value that does not parse is a `Permanent` error. */
  getJson<T = any>(key: string): T | undefined;
  getJsonVersioned<T = any>(key: string): { value: T | undefined; version: Version };
  /** Writes bytes (a string as UTF-8). Commits only if the attempt completes. */
  set(label: string, key: string, value: Uint8Array | string): void;
  setJson(label: string, key: string, value: unknown): void;
  /**
   * Writes only if the key still has `version`; `false` if another write came first (nothing was
   * written: read again and decide again).
   */
  setIf(label: string, key: string, value: Uint8Array | string, version: Version): boolean;
  setJsonIf(label: string, key: string, value: unknown, version: Version): boolean;
  /**
   * Read-modify-write without lost updates: reads the key, computes its new value with `update`
   * (given the current one, if any; synchronous), and writes it only if nobody wrote the key in
   * between, reading again if somebody did (up to `UPDATE_TRIES` times, then `Transient`). Returns
   * the value written.
   */
  updateJson<T = any>(label: string, key: string, update: (current: T | undefined) => T): T;
  delete(label: string, key: string): void;
}

/**
 * Durable key-value state, the tool's own namespace (named after the tool); `kv.namespace(name)`
 * reaches another, which the operator must grant (`kv = ["name"]` under `[tools.NAME.grants]`).
 * Writes commit in the same transaction as their record, and only if the attempt completes. A
 * read-modify-write of a key other steps write too (a counter, a stock level) must use `setIf`
 * with the version read, or `updateJson`, or one update is lost.
 */
export const kv: KvNamespace & {
  readonly ABSENT: Version;
  readonly UPDATE_TRIES: number;
  namespace(name: string): KvNamespace;
};

/** Messages for later delivery, enqueued in the same transaction as their record. */
export const outbox: {
  /** Enqueues `payload` (as JSON) to a topic granted to the tool. */
  send(label: string, topic: string, payload: unknown): void;
};

/** Calls an effect provider the embedder registered under `name`, with JSON in and out. */
export function provider<R = any>(label: string, name: string, request: unknown): R;

/** The key the host derived for this operation (for tools that must put it in a body or a URL). */
export function operationKey(): string;

/** An operator-supplied setting (a base URL, a currency), or undefined; never from the model's
 * args, never a secret. */
export function config(key: string): string | undefined;
