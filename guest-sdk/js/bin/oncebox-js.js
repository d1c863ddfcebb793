#!/usr/bin/env node
// oncebox-js build [DIR]: builds the tool project in DIR (default: the current directory) to a
// WebAssembly component, as its package.json's "oncebox" field says.
import { relative } from 'node:path';
import { build, BuildError } from '../src/build.js';

const USAGE = `usage: oncebox-js build [DIR]

Builds the oncebox tool in DIR (default: .) to a WebAssembly component, as DIR/package.json says:
  "oncebox": {"entry": "tool.js", "class": "read-only", "output": "NAME.wasm"}
class: read-only, idempotent-write, compensatable or irreversible; output defaults to NAME.wasm.`;

const [command, dir, ...rest] = process.argv.slice(2);
if (command === '--help' || command === '-h' || command === 'help') {
  console.log(USAGE);
  process.exit(0);
}
if (command !== 'build' || rest.length > 0) {
  console.error(USAGE);
  process.exit(2);
}

try {
  const built = await build(dir ?? process.cwd());
  const where = relative(process.cwd(), built.output) || built.output;
  const mb = (built.bytes / 1024 / 1024).toFixed(1);
  console.log(`oncebox-js: built ${where} (${built.name}, ${built.cls}, world ${built.world}, ${mb} MiB, ${(built.ms / 1000).toFixed(1)} s)`);
} catch (e) {
  if (e instanceof BuildError) {
    console.error(`oncebox-js: ${e.message}`);
  } else {
    console.error(`oncebox-js: ${e?.stack ?? e}`);
  }
  process.exit(1);
}
