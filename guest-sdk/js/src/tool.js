// defineTool, the reconcile answers, and what the component exports.

import { http } from './api.js';
import { Permanent, isToolError } from './errors.js';

export const CLASSES = ['read-only', 'idempotent-write', 'compensatable', 'irreversible'];
const RECONCILING = new Set(['compensatable', 'irreversible']);

// The one tool of this component: `defineTool` records it, the build's entry exports it.
let defined;

/**
 * Declares the component's tool. Called once, at the top level of the entry module (the build
 * evaluates it then, so a mistake here fails the build).
 */
export function defineTool(def) {
  if (defined) throw new Error('oncebox: defineTool was called twice; a component is one tool');
  defined = validate(def);
  return def;
}

function validate(def) {
  const fail = (what) => {
    throw new Error(`oncebox: defineTool: ${what}`);
  };
  if (!def || typeof def !== 'object') fail('takes one object: {name, description, class, args, invoke, ...}');
  const { name, description, args, invoke, reconcile } = def;
  const cls = def.class;
  if (typeof name !== 'string' || name === '') fail('`name` must be a non-empty string');
  if (typeof description !== 'string') fail('`description` must be a string (one sentence for the model and the operator)');
  if (!CLASSES.includes(cls)) fail(`\`class\` must be one of ${CLASSES.join(', ')} (got ${JSON.stringify(cls)})`);
  if (!args || typeof args !== 'object' || Array.isArray(args)) fail('`args` must be the JSON Schema (an object) the args must satisfy');
  if (typeof invoke !== 'function') fail('`invoke(args)` must be a function');
  if (RECONCILING.has(cls) && typeof reconcile !== 'function') {
    fail(`a ${cls} tool must define \`reconcile(effectKey, args)\`: the host asks it what became of an effect whose answer was lost`);
  }
  if (!RECONCILING.has(cls) && reconcile !== undefined) {
    fail(`a ${cls} tool has no \`reconcile\` (only compensatable and irreversible tools export one)`);
  }
  const sensitive = def.sensitive ?? [];
  if (!Array.isArray(sensitive) || !sensitive.every((p) => typeof p === 'string')) {
    fail('`sensitive` must be a list of JSON pointers into the args ("/payment_method")');
  }
  const pairs = def.compensationArgs === undefined ? [] : Array.isArray(def.compensationArgs) ? def.compensationArgs : Object.entries(def.compensationArgs);
  if (!pairs.every((p) => Array.isArray(p) && p.length === 2 && p.every((s) => typeof s === 'string'))) {
    fail('`compensationArgs` must map the compensating tool\'s arg names to JSON pointers: {order_id: "/args/order_id"}');
  }
  for (const key of ['compensatedBy', 'consequence', 'version']) {
    if (def[key] !== undefined && typeof def[key] !== 'string') fail(`\`${key}\` must be a string`);
  }
  return {
    name,
    description,
    class: cls,
    schema: JSON.stringify(args),
    compensatedBy: def.compensatedBy,
    compensationArgs: pairs.map(([a, p]) => [a, p]),
    consequence: def.consequence,
    sensitive: [...sensitive],
    version: def.version,
    invoke,
    reconcile,
  };
}

/** The effect took place; `output` is what the tool would have returned for the operation. */
export function committed(output) {
  return Object.freeze({ kind: 'committed', output });
}

/**
 * The authority has no record of the effect. Only "no record of it *now*": a downstream still
 * processing the request, or one whose index lags, shows nothing for an effect that will commit.
 * The host counts it as proof only once the downstream's settle window (per host, 5 minutes by
 * default) has passed since the effect's last send ended; before that the operation stays unknown.
 */
export const NOT_COMMITTED = Object.freeze({ kind: 'not-committed' });

/** The authority cannot tell. Not proof of anything. */
export const STILL_UNKNOWN = Object.freeze({ kind: 'still-unknown' });

/**
 * Asks an authority that looks effects up by their key (as Stripe-like APIs do): 200 with a JSON
 * body is committed (the body is the output); 404 is "no record of it now", which the host counts
 * as not committed only after the settle window; anything else (an error, a 5xx, a body that does
 * not parse) proves nothing. The lookup is a read (`http.get`): its URL's origin must be granted
 * to the tool like its effects' (`[tools.NAME.grants] http`).
 *
 * `toOutput(body)`, if given, makes the tool's output of the parsed body (as `invoke` would have
 * returned it); if it throws, the answer proves nothing (STILL_UNKNOWN).
 */
export function lookup(url, toOutput = (body) => body) {
  let response;
  try {
    response = http.get(url);
  } catch (e) {
    if (isToolError(e)) return STILL_UNKNOWN;
    throw e;
  }
  if (response.status === 404) return NOT_COMMITTED;
  if (response.status !== 200) return STILL_UNKNOWN;
  try {
    return committed(toOutput(JSON.parse(response.text())));
  } catch {
    return STILL_UNKNOWN;
  }
}

/** The reconcile answers and `lookup`, in one place. */
export const Reconciliation = Object.freeze({ committed, NOT_COMMITTED, STILL_UNKNOWN, lookup });

// An exception that is not a ToolError is a bug, not an answer: it must fail the attempt (a trap,
// which the host reports with the guest's stderr), never become a `permanent` error that would
// promise nothing took effect. componentize-js traps on an `Error` thrown from an export but
// turns any other thrown value into the result's `err` (an Error carrying its own `payload`, such
// as a raw ComponentError, too), and does not print either: print it, then throw a new Error that
// has no payload.
function bug(where, e) {
  const text = e instanceof Error ? (e.stack ? `${e}\n${e.stack}` : String(e)) : `uncaught ${typeof e}: ${safeString(e)}`;
  console.error(`oncebox: ${where} threw: ${text}`);
  return new Error(`${where} threw ${e instanceof Error ? String(e) : safeString(e)}`, { cause: e });
}

function safeString(v) {
  try {
    return typeof v === 'string' ? v : JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}

function outputJson(name, output) {
  const json = JSON.stringify(output === undefined ? null : output);
  if (json === undefined) throw new TypeError(`${name}'s output is not JSON: ${String(output)}`);
  return json;
}

/**
 * The component's exports for the class the build chose (package.json `oncebox.class`). Throws,
 * and so fails the build, if the entry defined no tool or one of another class.
 */
export function componentExports(cls, packageVersion) {
  if (!defined) {
    throw new Error('oncebox: the entry module did not call defineTool({...}) (import { defineTool } from "@oncebox/tool")');
  }
  const t = defined;
  if (t.class !== cls) {
    throw new Error(`oncebox: defineTool says class "${t.class}" but package.json "oncebox.class" says "${cls}"; make them agree`);
  }
  const manifest = {
    name: t.name,
    version: t.version ?? packageVersion ?? '0.0.0',
    description: t.description,
    class: t.class,
    inputSchema: t.schema,
    compensatedBy: t.compensatedBy,
    compensationArgs: t.compensationArgs,
    consequence: t.consequence,
    sensitive: t.sensitive,
  };

  const tool = {
    describe() {
      return manifest;
    },
    async invoke(argsJson) {
      let args;
      try {
        args = JSON.parse(argsJson);
      } catch (e) {
        // The host validated the args against the schema already: retrying cannot fix this.
        throw new Permanent(`invalid args: ${e.message}`);
      }
      let output;
      try {
        output = await t.invoke(args);
      } catch (e) {
        if (isToolError(e)) throw e;
        throw bug(`${t.name}: invoke`, e);
      }
      try {
        return outputJson(t.name, output);
      } catch (e) {
        throw bug(`${t.name}: invoke`, e);
      }
    },
  };
  if (!RECONCILING.has(cls)) return { tool };

  const reconcile = {
    async reconcile(effectKey, argsJson) {
      let args;
      try {
        args = JSON.parse(argsJson);
      } catch {
        return { tag: 'still-unknown' };
      }
      let answer;
      try {
        answer = await t.reconcile(effectKey, args);
      } catch (e) {
        // A read that failed (a ToolError) proves nothing; anything else is a bug.
        if (isToolError(e)) return { tag: 'still-unknown' };
        throw bug(`${t.name}: reconcile`, e);
      }
      switch (answer?.kind) {
        case 'committed':
          try {
            return { tag: 'committed', val: outputJson(t.name, answer.output) };
          } catch (e) {
            throw bug(`${t.name}: reconcile`, e);
          }
        case 'not-committed':
          return { tag: 'not-committed' };
        case 'still-unknown':
          return { tag: 'still-unknown' };
        default:
          throw bug(`${t.name}: reconcile`, new TypeError(`reconcile must return committed(output), NOT_COMMITTED or STILL_UNKNOWN, not ${safeString(answer)}`));
      }
    },
  };
  return { tool, reconcile };
}
