// Effects and reads as plain functions over the contract's imports.
//
// Every function taking a `label` is an effect: the host derives its key from the operation, the
// label and how many times this invocation used the label, records it before and after dispatch,
// and answers it from the record when the operation runs again. Give each logical effect its own
// constant label ("charge", "send-receipt").

import { httpGet, kvGet } from 'oncebox:tool/reads@0.1.0';
import { get as configGet } from 'oncebox:tool/config@0.1.0';
import * as effects from '#effects';

import { Permanent, Transient, callImport } from './errors.js';

const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder();

/** A value as bytes: a Uint8Array as it is, a string as UTF-8. */
function bytes(value, what) {
  if (value instanceof Uint8Array) return value;
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (typeof value === 'string') return utf8.encode(value);
  if (value === undefined || value === null) return new Uint8Array(0);
  throw new TypeError(`${what} must be a Uint8Array or a string`);
}

/** JSON text as bytes. A value JSON cannot express (undefined, a BigInt, a cycle) is a bug. */
function jsonBytes(value, what) {
  const text = JSON.stringify(value);
  if (text === undefined) throw new TypeError(`${what} is not JSON: ${String(value)}`);
  return utf8.encode(text);
}

/** JSON text parsed; text that does not parse is a permanent error (a contract breach by the
 * downstream, not a blip). */
function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Permanent(`invalid JSON: ${e.message}`);
  }
}

/** Headers as the contract's list of pairs, from pairs or a plain object. */
function headerPairs(headers) {
  if (headers === undefined || headers === null) return [];
  const pairs = Array.isArray(headers) ? headers : Object.entries(headers);
  return pairs.map(([k, v]) => [String(k), String(v)]);
}

function checkLabel(label) {
  if (typeof label !== 'string' || label === '') {
    throw new TypeError('an effect needs a label: a constant, non-empty string ("charge", "send-receipt")');
  }
}

/** An HTTP answer: `status`, `headers` (pairs), `body` (bytes). */
export class HttpResponse {
  constructor({ status, headers, body }) {
    this.status = status;
    this.headers = headers;
    this.body = body;
  }

  /**
   * Any 2xx: 200, 201 Created, 202 Accepted, 204 No Content. Never compare with 200 alone: a
   * downstream that answers 201 would have its every commit recorded as a failure.
   */
  isSuccess() {
    return this.status >= 200 && this.status < 300;
  }

  /** The body as text (UTF-8). */
  text() {
    return fromUtf8.decode(this.body);
  }

  /** The body parsed as JSON; a body that does not parse is a permanent error. */
  json() {
    return parseJson(this.text());
  }

  /**
   * The body as JSON when the status is any 2xx; any other status the tool sees (3xx, or a 4xx
   * refusal: the host turns 408, 409, 429 and 5xx into errors before the tool sees them) is a
   * permanent error naming it. Check the statuses that mean something to your tool (402: card
   * declined) before calling this.
   */
  jsonIfSuccess() {
    if (this.isSuccess()) return this.json();
    const body = Array.from(this.text()).slice(0, 200).join('');
    throw new Permanent(`the downstream answered ${this.status}: ${body}`);
  }

  /** The first header with this name, compared case-insensitively; undefined if none. */
  header(name) {
    const lower = String(name).toLowerCase();
    const found = this.headers.find(([k]) => k.toLowerCase() === lower);
    return found ? found[1] : undefined;
  }
}

/** HTTP: reads (`get`) and effects (`postJson`, `send`). */
export const http = {
  /** A side-effect-free GET to a granted origin. No ledger entry. */
  get(url, headers) {
    return new HttpResponse(callImport(httpGet, String(url), headerPairs(headers)));
  },

  /** An HTTP effect with a JSON body. The host adds `Idempotency-Key`. */
  postJson(label, url, body) {
    return http.send(label, {
      method: 'POST',
      url,
      headers: [['content-type', 'application/json']],
      body: jsonBytes(body, 'the body'),
    });
  },

  /**
   * Any HTTP effect: `{method, url, headers, body}` (headers as pairs or an object, body as bytes
   * or a string). The host adds `Idempotency-Key`; the tool may not set it, nor `Host`.
   */
  send(label, { method = 'POST', url, headers, body } = {}) {
    checkLabel(label);
    const request = { method: String(method), url: String(url), headers: headerPairs(headers), body: bytes(body, 'the body') };
    return new HttpResponse(callImport(effects.http, label, request));
  },
};

/** How often `updateJson` reads again after another write came first. */
export const UPDATE_TRIES = 16;

/** The version of a key that does not exist: `setIf(..., ABSENT)` creates a key only if nobody
 * else has. Versions are opaque BigInts: compare them, never order them. */
export const ABSENT = 0n;

/** A KV namespace: the tool's own (`kv` itself), or one granted to it (`kv.namespace(name)`). */
export class Namespace {
  constructor(name) {
    this.name = name;
  }

  /** The value as bytes, or undefined. */
  get(key) {
    return this.getVersioned(key).value;
  }

  /** `{value, version}`: the value (undefined if none) and its version (`ABSENT` if none). */
  getVersioned(key) {
    const entry = callImport(kvGet, this.name, String(key));
    return entry ? { value: entry.value, version: entry.version } : { value: undefined, version: ABSENT };
  }

  /** A JSON value, or undefined; a value that does not parse is a permanent error. */
  getJson(key) {
    return this.getJsonVersioned(key).value;
  }

  /** `{value, version}` with the value parsed as JSON. */
  getJsonVersioned(key) {
    const { value, version } = this.getVersioned(key);
    return { value: value === undefined ? undefined : parseJson(fromUtf8.decode(value)), version };
  }

  /** Writes bytes (or a string, as UTF-8). An effect: commits only if the attempt completes. */
  set(label, key, value) {
    checkLabel(label);
    callImport(effects.kvSet, label, this.name, String(key), bytes(value, 'the value'));
  }

  setJson(label, key, value) {
    this.set(label, key, jsonBytes(value, 'the value'));
  }

  /**
   * Writes `value` only if the key still has `version` (from `getVersioned`; `ABSENT`: the key
   * must not exist). `false`: another write came first, and nothing was written: read again and
   * decide again.
   */
  setIf(label, key, value, version) {
    checkLabel(label);
    return callImport(effects.kvSetIf, label, this.name, String(key), bytes(value, 'the value'), BigInt(version));
  }

  setJsonIf(label, key, value, version) {
    return this.setIf(label, key, jsonBytes(value, 'the value'), version);
  }

  /**
   * Read-modify-write without lost updates: reads the key, computes its new value with
   * `update(current)` (current is undefined if the key is absent; synchronous), and writes it
   * only if nobody wrote the key in between, reading again if somebody did. Returns the value
   * written. A counter or a stock level that other steps write too must be updated this way.
   */
  updateJson(label, key, update) {
    for (let i = 0; i < UPDATE_TRIES; i++) {
      const { value, version } = this.getJsonVersioned(key);
      const next = update(value);
      if (next instanceof Promise) throw new TypeError('updateJson: update must be synchronous');
      if (this.setJsonIf(label, key, next, version)) return next;
    }
    throw new Transient(`kv: \`${key}\` kept changing under concurrent writes`);
  }

  delete(label, key) {
    checkLabel(label);
    callImport(effects.kvDelete, label, this.name, String(key));
  }
}

const own = new Namespace(undefined);

/**
 * Durable key-value state. `kv.get`, `kv.set`, ... use the tool's own namespace (named after the
 * tool); `kv.namespace(name)` reaches another, which the operator must grant (`kv = ["name"]`
 * under `[tools.NAME.grants]`). Writes commit in the same transaction as their record, and only if
 * the attempt completes (a failed attempt's writes are discarded).
 *
 * A read-modify-write of a key that other steps write too (a counter, a stock level) must use
 * `setIf` with the version read, or `updateJson`, or two steps that read the same value both write
 * their sum and one update is lost.
 */
export const kv = {
  ABSENT,
  UPDATE_TRIES,
  namespace: (name) => new Namespace(String(name)),
  get: (key) => own.get(key),
  getVersioned: (key) => own.getVersioned(key),
  getJson: (key) => own.getJson(key),
  getJsonVersioned: (key) => own.getJsonVersioned(key),
  set: (label, key, value) => own.set(label, key, value),
  setJson: (label, key, value) => own.setJson(label, key, value),
  setIf: (label, key, value, version) => own.setIf(label, key, value, version),
  setJsonIf: (label, key, value, version) => own.setJsonIf(label, key, value, version),
  updateJson: (label, key, update) => own.updateJson(label, key, update),
  delete: (label, key) => own.delete(label, key),
};

/** Messages for later delivery, enqueued in the same transaction as their record. */
export const outbox = {
  /** Enqueues `payload` (as JSON) to a topic granted to the tool. */
  send(label, topic, payload) {
    checkLabel(label);
    callImport(effects.outbox, label, String(topic), jsonBytes(payload, 'the payload'));
  },
};

/** Calls an effect provider the embedder registered under `name`, with JSON in and out. */
export function provider(label, name, request) {
  checkLabel(label);
  const text = JSON.stringify(request);
  if (text === undefined) throw new TypeError(`the request is not JSON: ${String(request)}`);
  return parseJson(callImport(effects.provider, label, String(name), text));
}

/** The key the host derived for this operation (for tools that must put it in a body or a URL). */
export function operationKey() {
  return effects.operationKey();
}

/** An operator-supplied setting (a base URL, a currency), or undefined; never from the model's
 * args, never a secret. */
export function config(key) {
  return configGet(String(key)) ?? undefined;
}
