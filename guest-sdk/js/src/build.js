// `oncebox-js build`: one tool project (its package.json's "oncebox" field) to one component.
//
// 1. esbuild bundles a generated entry (the tool's module, then the SDK's exports for its class)
//    into one ES module: componentize-js (StarlingMonkey) resolves relative imports only, not
//    npm packages. For a read-only tool the bundle is made with the `oncebox-read-only`
//    condition, which resolves the SDK's `#effects` to a module without the `effects` import.
// 2. componentize-js makes the component against the SDK's own WIT and the class's world, with
//    its `http` and `fetch-event` features off (they import wasi:http, which oncebox does not
//    link: a tool's HTTP goes through the contract's imports).

import { readFile, writeFile, mkdir, stat } from 'node:fs/promises';
import { dirname, join, resolve, relative, isAbsolute, basename, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

export const SDK_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const WIT_DIR = join(SDK_DIR, 'wit');

/** The WIT world each class is built against. */
export const WORLDS = {
  'read-only': 'read-only-tool',
  'idempotent-write': 'idempotent-tool',
  compensatable: 'compensatable-tool',
  irreversible: 'irreversible-tool',
};

/** componentize-js features left off: both import wasi:http, which the host refuses. */
export const DISABLED_FEATURES = ['http', 'fetch-event'];

/** A mistake in the project, told in one line. */
export class BuildError extends Error {}

const EXAMPLE = '"oncebox": {"entry": "tool.js", "class": "read-only", "output": "NAME.wasm"}';

/** Reads and checks the project's package.json: `{dir, name, version, entry, cls, world, output}`. */
export async function readProject(dir) {
  const pkgPath = join(dir, 'package.json');
  let pkg;
  try {
    pkg = JSON.parse(await readFile(pkgPath, 'utf8'));
  } catch (e) {
    throw new BuildError(e.code === 'ENOENT' ? `no package.json in ${dir}` : `${pkgPath}: ${e.message}`);
  }
  const cfg = pkg.oncebox;
  if (!cfg || typeof cfg !== 'object') throw new BuildError(`package.json has no "oncebox" field; add ${EXAMPLE}`);
  const classes = Object.keys(WORLDS).join(', ');
  if (typeof cfg.entry !== 'string' || cfg.entry === '') {
    throw new BuildError('package.json "oncebox.entry" is missing: the tool\'s module, e.g. "tool.js"');
  }
  if (cfg.class === undefined) throw new BuildError(`package.json "oncebox.class" is missing: one of ${classes}`);
  if (!Object.hasOwn(WORLDS, cfg.class)) {
    throw new BuildError(`unknown class ${JSON.stringify(cfg.class)} in package.json "oncebox.class": one of ${classes}`);
  }
  const entry = resolve(dir, cfg.entry);
  try {
    if (!(await stat(entry)).isFile()) throw new Error();
  } catch {
    throw new BuildError(`the entry ${cfg.entry} (package.json "oncebox.entry") does not exist in ${dir}`);
  }
  if (cfg.output !== undefined && (typeof cfg.output !== 'string' || cfg.output === '')) {
    throw new BuildError('package.json "oncebox.output" must be a file name, e.g. "NAME.wasm"');
  }
  const name = typeof pkg.name === 'string' ? basename(pkg.name) : basename(dir);
  return {
    dir,
    name,
    version: typeof pkg.version === 'string' ? pkg.version : undefined,
    entry,
    cls: cfg.class,
    world: WORLDS[cfg.class],
    output: resolve(dir, cfg.output ?? `${name}.wasm`),
  };
}

/** The generated entry: the tool's module, then the exports of its class's world. */
function entrySource(project) {
  let spec = relative(project.dir, project.entry).split(sep).join('/');
  if (!spec.startsWith('.') && !isAbsolute(spec)) spec = `./${spec}`;
  const lines = [
    `import ${JSON.stringify(spec)};`,
    `import { componentExports } from '@oncebox/tool/internal';`,
    `const exported = componentExports(${JSON.stringify(project.cls)}, ${JSON.stringify(project.version)});`,
    `export const tool = exported.tool;`,
  ];
  if (project.world !== 'read-only-tool' && project.world !== 'idempotent-tool') {
    lines.push(`export const reconcile = exported.reconcile;`);
  }
  return lines.join('\n') + '\n';
}

/** Bundles the project into one ES module at `bundlePath`. */
export async function bundle(project, bundlePath) {
  const esbuild = await import('esbuild');
  try {
    await esbuild.build({
      stdin: { contents: entrySource(project), resolveDir: project.dir, sourcefile: 'oncebox-entry.js', loader: 'js' },
      bundle: true,
      format: 'esm',
      platform: 'neutral',
      mainFields: ['module', 'main'],
      conditions: project.cls === 'read-only' ? ['oncebox-read-only'] : [],
      external: ['oncebox:*'],
      target: 'es2022',
      outfile: bundlePath,
      logLevel: 'silent',
    });
  } catch (e) {
    const first = e.errors?.[0];
    if (first) {
      const where = first.location ? `${first.location.file}:${first.location.line}: ` : '';
      throw new BuildError(`bundling failed: ${where}${first.text}`);
    }
    throw e;
  }
}

/**
 * Builds the project in `dir`: returns `{output, world, cls, bytes, ms, bundlePath}`. Throws a
 * BuildError for a mistake in the project.
 */
export async function build(dir = process.cwd()) {
  const started = Date.now();
  const project = await readProject(resolve(dir));
  // Kept after the build: stack traces in the tool's stderr name its lines.
  const bundlePath = join(project.dir, 'node_modules', '.cache', 'oncebox-js', `${project.name}.js`);
  await mkdir(dirname(bundlePath), { recursive: true });
  await bundle(project, bundlePath);

  const { componentize } = await import('@bytecodealliance/componentize-js');
  let component;
  try {
    ({ component } = await componentize({
      sourcePath: bundlePath,
      witPath: WIT_DIR,
      worldName: project.world,
      disableFeatures: DISABLED_FEATURES,
    }));
  } catch (e) {
    // The top level of the bundle runs at build time (wizer): defineTool's checks fail here.
    const message = String(e?.message ?? e);
    const ours = message.split('\n').find((l) => l.includes('oncebox: '));
    if (ours) throw new BuildError(ours.slice(ours.indexOf('oncebox: ') + 'oncebox: '.length).trim());
    throw new BuildError(`componentize-js failed: ${message}`);
  }
  await mkdir(dirname(project.output), { recursive: true });
  await writeFile(project.output, component);
  return {
    output: project.output,
    world: project.world,
    cls: project.cls,
    name: project.name,
    bytes: component.byteLength,
    ms: Date.now() - started,
    bundlePath,
  };
}
