// The npm tarball (dist/kiln-web-*.tgz, made by `npm run build -- --pack`)
// installs into a scratch Node project, and a small training script runs
// there through the package's public entry points (ESM and CommonJS).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { webDir, tmpDir } from './helpers.mjs';

const dist = path.join(webDir, 'dist');

test('npm install of the tarball, then training in Node', (t) => {
  const tarballs = fs.existsSync(dist) ? fs.readdirSync(dist).filter((f) => /^kiln-web-.*\.tgz$/.test(f)) : [];
  assert.equal(tarballs.length, 1, `expected one tarball in ${dist}: run \`node scripts/build.mjs --pack\``);
  const tgz = path.join(dist, tarballs[0]);
  const dir = tmpDir('kiln-web-scratch-');
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'scratch', private: true, type: 'module' }));
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--offline', tgz], { cwd: dir, stdio: 'pipe' });
  const manifest = JSON.parse(fs.readFileSync(path.join(dir, 'node_modules', 'kiln-web', 'package.json'), 'utf8'));
  t.diagnostic(`installed ${manifest.name}@${manifest.version} from ${tarballs[0]}`);

  fs.writeFileSync(path.join(dir, 'train.mjs'), `
import { init, Kiln, Adam, crossEntropy, loadDigits } from 'kiln-web';
await init();
const kiln = await Kiln.create();
const { train, test } = await loadDigits(0.2, 1);
const model = kiln.mlp([64, 32, 10]);
const opt = new Adam(model, 1e-2);
const g = kiln.graph();
const losses = [];
for (let epoch = 0; epoch < 3; epoch++) {
  const order = train.epochOrder(9, epoch);
  for (let i = 0; i < order.length; i += 64) {
    const b = train.gather(order.subarray(i, i + 64));
    g.reset();
    const loss = crossEntropy(model.forward(g.tensor(b.images, [b.size, 64])), g.tensor(b.labels, [b.size]));
    opt.zeroGrad(); loss.backward(); opt.step();
    losses.push(await loss.item());
  }
}
g.reset();
const pred = await g.noGrad(() => model.forward(g.tensor(test.images, [test.length, 64])).argmax(1)).toArray();
const labels = test.labels;
const accuracy = pred.filter((p, i) => p === labels[i]).length / pred.length;
console.log(JSON.stringify({ device: kiln.device, first: losses[0], last: losses.at(-1), accuracy }));
`);
  const esm = JSON.parse(execFileSync('node', ['train.mjs'], { cwd: dir, encoding: 'utf8' }).trim());
  t.diagnostic(`ESM: ${JSON.stringify(esm)}`);
  assert.equal(esm.device, 'cpu');
  assert.ok(esm.last < esm.first * 0.3, `loss ${esm.first} -> ${esm.last}`);
  assert.ok(esm.accuracy > 0.9, `accuracy ${esm.accuracy}`);

  fs.writeFileSync(path.join(dir, 'train.cjs'), `
const { init, Kiln, Sgd, mseLoss } = require('kiln-web');
(async () => {
  await init();
  const kiln = await Kiln.create();
  const lin = kiln.linear(1, 1, true, 0);
  const opt = new Sgd(lin, 0.1);
  const g = kiln.graph();
  let loss;
  for (let i = 0; i < 200; i++) {
    g.reset();
    const x = g.tensor(new Float32Array([0, 1, 2, 3]), [4, 1]);
    loss = mseLoss(lin.forward(x), x.mul(3).add(1));
    opt.zeroGrad(); loss.backward(); opt.step();
  }
  console.log(JSON.stringify({ loss: await loss.item(), w: Array.from(await lin.weight.value()) }));
})();
`);
  const cjs = JSON.parse(execFileSync('node', ['train.cjs'], { cwd: dir, encoding: 'utf8' }).trim());
  t.diagnostic(`CommonJS: ${JSON.stringify(cjs)}`);
  assert.ok(cjs.loss < 1e-4 && Math.abs(cjs.w[0] - 3) < 0.01, JSON.stringify(cjs));

  // The TypeScript declarations ship and name the API.
  const dts = fs.readFileSync(path.join(dir, 'node_modules', 'kiln-web', 'web', 'kiln_web.d.ts'), 'utf8');
  for (const name of ['class Kiln', 'class Graph', 'class Tensor', 'class Adam', 'crossEntropy', 'add(other: Tensor | number): Tensor']) {
    assert.ok(dts.includes(name), `kiln_web.d.ts lacks ${name}`);
  }
  fs.rmSync(dir, { recursive: true, force: true });
});
