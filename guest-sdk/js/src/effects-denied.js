// What a read-only build resolves `#effects` to (package.json "imports", condition
// `oncebox-read-only`): no reference to the `effects` import at all, so the component does not
// import it and the host loads it as read-only. Every effect fails as a permanent error.
import { Permanent } from './errors.js';

function denied(what) {
  return () => {
    throw new Permanent(`a read-only tool cannot make effects (${what}): declare another class in package.json "oncebox.class"`);
  };
}

export const http = denied('http.send');
export const kvSet = denied('kv.set');
export const kvDelete = denied('kv.delete');
export const kvSetIf = denied('kv.setIf');
export const outbox = denied('outbox.send');
export const provider = denied('provider');
export const operationKey = denied('operationKey');
