// The contract's `tool-error` as JavaScript exceptions.
//
// componentize-js lowers a value thrown from an export that returns `result<_, tool-error>` by
// the thrown object's own `payload` property (`{tag, val}`), and rethrows (traps on) any other
// `Error`; an import's `err` arrives as its `ComponentError`, whose `payload` is the same
// `{tag, val}`. These classes carry such a payload, so throwing one from `invoke` returns that
// tool-error, and the SDK's wrappers turn every import's `ComponentError` into one of them.

// A brand shared by every copy of the SDK in a bundle, so `isToolError` never depends on which
// copy made the error.
const BRAND = Symbol.for('oncebox.tool-error');

/** Base class of the four ways an invocation or an effect can fail. */
export class ToolError extends Error {
  constructor(tag, val, message) {
    super(message);
    this.name = new.target.name;
    // Own, non-enumerable: what componentize-js's export glue reads.
    Object.defineProperty(this, 'payload', { value: { tag, val }, enumerable: false });
    Object.defineProperty(this, BRAND, { value: true, enumerable: false });
  }

  /** The contract's name for it: transient, rate-limited, permanent or unknown-outcome. */
  get kind() {
    return this.payload.tag;
  }
}

/** Nothing took effect; another attempt may succeed. */
export class Transient extends ToolError {
  constructor(message) {
    super('transient', String(message), String(message));
  }
}

/** Invalid input, a rejected payment, a business rule: never retried. */
export class Permanent extends ToolError {
  constructor(message) {
    super('permanent', String(message), String(message));
  }
}

/** Nothing took effect; the downstream asked to wait `retryAfterMs`. */
export class RateLimited extends ToolError {
  constructor(retryAfterMs, message) {
    const ms = toU64(retryAfterMs);
    super('rate-limited', { retryAfterMs: ms, message: String(message) }, String(message));
    /** Milliseconds, as a number. */
    this.retryAfterMs = Number(ms);
  }
}

/**
 * An effect may have committed but its answer does not say (a provider's 5xx, a "pending" that
 * never settles, a body cut short): the operation ends `unknown` and is reconciled through the
 * tool's `reconcile`, never retried blindly and never recorded as `failed` (which promises that
 * nothing took effect). The contract's `unknown-outcome`. The host already treats 408, 409 and
 * 5xx answers to HTTP effects, and a lost connection, this way before the tool sees them.
 */
export class MayHaveCommitted extends ToolError {
  constructor(message) {
    super('unknown-outcome', String(message), String(message));
  }
}

/** The contract's name for `MayHaveCommitted`. */
export const UnknownOutcome = MayHaveCommitted;

/** Whether `e` is one of the errors above (from any copy of the SDK). */
export function isToolError(e) {
  return e !== null && typeof e === 'object' && e[BRAND] === true;
}

function toU64(value) {
  let n;
  try {
    n = typeof value === 'bigint' ? value : BigInt(Math.max(0, Math.floor(Number(value) || 0)));
  } catch {
    n = 0n;
  }
  return BigInt.asUintN(64, n < 0n ? 0n : n);
}

/**
 * Turns an import's failure into a ToolError: componentize-js throws a `ComponentError` whose
 * `payload` is the `tool-error` variant. Anything else (a bug in the glue, a TypeError from a
 * wrong argument) is returned as it is.
 */
export function fromImportError(e) {
  const p = e && typeof e === 'object' ? e.payload : undefined;
  if (!p || typeof p !== 'object') return e;
  switch (p.tag) {
    case 'transient':
      return new Transient(p.val);
    case 'permanent':
      return new Permanent(p.val);
    case 'rate-limited':
      return new RateLimited(p.val.retryAfterMs, p.val.message);
    case 'unknown-outcome':
      return new MayHaveCommitted(p.val);
    default:
      return e;
  }
}

/** Calls an import, turning its `err` into a ToolError. */
export function callImport(fn, ...args) {
  try {
    return fn(...args);
  } catch (e) {
    throw fromImportError(e);
  }
}
