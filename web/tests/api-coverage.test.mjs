// The public Rust API against the JavaScript one: every public function,
// struct, enum and trait of kiln-core's `nn` and `optim` modules and the
// autograd items re-exported at kiln-core's root (layers, losses,
// initialisers, optimizers, parameter groups, schedules, clipping,
// checkpointing) must have a JS counterpart in the package's typings, or a
// declared exception with the reason. A new public Rust item makes this
// test fail, naming it, until JS gets it or the exception list says why
// not. (Ops are checked separately: tests/op-coverage.mjs in the suite.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { webDir } from './helpers.mjs';

const core = path.join(webDir, '..', 'core', 'src');
const typings = ['pkg/index.d.ts', 'pkg/web/kiln_web.d.ts'].map((f) => fs.readFileSync(path.join(webDir, f), 'utf8')).join('\n');

// Rust item -> the JS name it has when that is not its own name or its
// camelCase / lowerCamelCase form.
// (Searched for literally in the typings.)
const renamed = {
  Module: 'export class Layer',                    // every layer object is a Module
  LeakyReLU: 'leakyRelu(',
  custom_vjp_many: 'function customVjp(',          // customVjp returns an array of outputs
  ParamGroup: 'lr?: number; weightDecay?: number', // { params, lr?, weightDecay? } in the constructors
};

// Public Rust items with no JS counterpart, and why.
export const exceptions = {
  Optimizer: 'a Rust trait; in JS the optimizers are the classes Sgd and Adam, with its methods',
  OptimizerState: 'a Rust trait behind stateDict/loadStateDict, which the optimizers have',
  ModuleField: "a Rust trait used by #[derive(Module)]; JS modules are built from kiln's layers",
  Activation: "an enum of activation names; JS passes the names ('relu', ...) to Sequential.add and the Tensor methods",
  ConvOptions: 'a Rust options struct; JS passes the same fields as an object to conv2d/convTranspose2d',
  AttentionDropout: 'an option of MultiheadAttention/TransformerBlock (the dropout probability) in JS',
  LayerCache: 'KvCache internals',
  'init::fans': 'a helper of the initialisers (fan-in/fan-out of a shape)',
  prefix_entries: 'a helper of #[derive(Module)] for checkpoint keys',
  dedup_params: 'a helper of Module::parameters',
  checkpoint_many: 'NOT DONE: activation checkpointing is not in JS',
  checkpoint: 'NOT DONE: activation checkpointing is not in JS',
  BackwardOptions: "its two fields are Tensor.backward(seed?, keepGraph?)'s arguments (higher order is graph.grad, as in Rust)",
};

/** `pub fn|struct|enum|trait NAME` at the top level of the module files. */
function publicItems() {
  const files = ['nn', 'optim'].flatMap((dir) => fs.readdirSync(path.join(core, dir)).map((f) => path.join(core, dir, f)));
  const items = new Map();
  for (const file of files) {
    for (const m of fs.readFileSync(file, 'utf8').matchAll(/^pub (?:fn|struct|enum|trait) ([A-Za-z_][A-Za-z0-9_]*)/gm)) {
      // Initialisers are named by their module: init::zeros is not Graph.zeros.
      const key = path.basename(file) === 'init.rs' ? `init::${m[1]}` : m[1];
      items.set(key, path.relative(path.join(webDir, '..'), file));
    }
  }
  // Autograd items re-exported at the crate root.
  const lib = fs.readFileSync(path.join(core, 'lib.rs'), 'utf8');
  const autograd = /^pub use autograd::\{([^}]*)\}/m.exec(lib);
  for (const name of autograd[1].split(',').map((s) => s.trim()).filter(Boolean)) items.set(name, 'core/src/lib.rs');
  return items;
}

const camel = (s) => s.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
const lowerFirst = (s) => (/^[A-Z]{2,}/.test(s) ? s.replace(/^[A-Z]+(?=[A-Z][a-z])|^[A-Z]+$/, (m) => m.toLowerCase()) : s[0].toLowerCase() + s.slice(1));

function counterpart(name) {
  // init::xavier_uniform -> kiln.initParam('xavierUniform', ...): the kind is a string literal in the typings.
  const init = /^init::(.*)$/.exec(name);
  if (init) return typings.includes('initParam(') && typings.includes(`'${camel(init[1])}'`) ? `initParam('${camel(init[1])}')` : null;
  if (name.includes('::')) return null;
  if (name in renamed) return typings.includes(renamed[name]) ? renamed[name] : null;
  const candidates = new Set([name, camel(name), lowerFirst(name), lowerFirst(camel(name)), name.toLowerCase()]);
  for (const c of candidates) {
    const re = new RegExp(`(class ${c}\\b|function ${c}\\(|^\\s+(static )?${c}\\()`, 'm');
    if (re.test(typings)) return c;
  }
  return null;
}

test('every public Rust item of nn, optim and autograd has a JS counterpart or a declared exception', (t) => {
  const items = publicItems();
  assert.ok(items.size > 40, `found only ${items.size} public items: is the scan still right?`);
  const missing = [];
  const covered = [];
  for (const [name, file] of items) {
    const js = counterpart(name);
    if (js) covered.push(`${name} -> ${js}`);
    else if (!(name in exceptions)) missing.push(`${name} (${file})`);
  }
  const notDone = Object.entries(exceptions).filter(([, why]) => why.startsWith('NOT DONE')).map(([n]) => n);
  t.diagnostic(`${covered.length} of ${items.size} public items have a JS counterpart; declared not done: ${notDone.join(', ')}`);
  // An exception for something JS now has, or that Rust no longer has, is stale.
  const stale = Object.keys(exceptions).filter((n) => !items.has(n) || counterpart(n));
  assert.deepEqual(stale, [], `exceptions to remove (JS has them now, or Rust no longer does): ${stale.join(', ')}`);
  assert.deepEqual(missing, [], `public Rust items with no JS counterpart: ${missing.join(', ')}`);
});
