// The `effects` import, linked: what a build for any class but read-only resolves `#effects` to.
export { http, kvSet, kvDelete, kvSetIf, outbox, provider, operationKey } from 'oncebox:tool/effects@0.1.0';
