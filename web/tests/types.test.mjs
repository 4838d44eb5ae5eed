// The package's TypeScript declarations type-check as a user would compile
// against them: installed from the tarball, `lib: ["es2022", "dom"]`,
// strict, and without `skipLibCheck` (so kiln's own .d.ts files are
// checked too). A small program uses the API, layers, checkpoints and
// KilnError; a deliberate type error must be reported (the check can fail).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { webDir, tmpDir } from './helpers.mjs';

const dist = path.join(webDir, 'dist');
const tsc = path.join(webDir, 'node_modules', 'typescript', 'bin', 'tsc');

const program = `
import { init, Kiln, Adam, Sgd, crossEntropy, KilnError, type KilnErrorKind, opKinds, Tensor, Layer, customOp, customVjp, findCustomOp, CustomOp, type CustomOpSpec, checkCustomOp, type CustomOpReport, Schedule, LrScheduler, clipGradNorm, clipGradValue, decaySplit, loadDigits, liveTensorHandles } from 'kiln-web';

export async function main(): Promise<number> {
  await init();
  const kiln = await Kiln.create('cpu');
  const info: string = kiln.deviceInfo;
  const model = kiln.sequential();
  const conv: Layer = kiln.conv2d(1, 2, 3, { padding: 1, seed: 1 });
  model.add(conv);
  model.add('relu');
  model.add(kiln.flatten());
  model.add(kiln.linear(2 * 4 * 4, 3));
  const opt = new Adam(model, 1e-3);
  const g = kiln.graph();
  const x: Tensor = g.randNormal([2, 1, 4, 4], 1);
  const loss = crossEntropy(model.forward(x), g.tensor(new Int32Array([0, 1]), [2]));
  loss.backward();
  const norm: number = await clipGradNorm(model, 1.0);
  clipGradValue(model.parameters(), 0.5);
  opt.step();
  const scheduler = new LrScheduler(opt, Schedule.warmupCosine(10, 100, 0.1).times(Schedule.constant()));
  scheduler.step();
  const lrs: number[] = Array.from(opt.groupLrs);
  const grouped = new Adam(decaySplit(model, 0.1), 1e-3);
  const custom = new Sgd([{ params: model.parameters(), lr: 0.01 }], 0.1);
  grouped.free(); custom.free(); scheduler.free();
  const digits = await loadDigits(0.2, 1);
  const handles: number = liveTensorHandles() + digits.train.length + norm + lrs.length;
  const bytes: Uint8Array = await model.stateDict();
  model.loadStateDict(bytes);
  const optState: Uint8Array = await opt.stateDict();
  opt.loadStateDict(optState);
  const sgd = new Sgd(model.parameters(), 0.1);
  sgd.free();
  const parts: Tensor[] = x.split([1, 1], 0);
  const spec: CustomOpSpec = {
    name: 'TsDouble', arity: 1,
    forward: ([a], out) => { for (let i = 0; i < a.length; i++) out[i] = a[i] * 2; },
    backward: (xs, y, grad) => [grad.mul(2)],
  };
  const double: CustomOp = findCustomOp('TsDouble') ?? customOp(spec);
  const doubled: Tensor = double.apply([x]);
  const reversed: Tensor[] = customVjp(([a]) => a.mul(2), [doubled], (xs, ys, gs) => [gs[0].neg()]);
  const checked: CustomOpReport = await checkCustomOp(double, [{ values: [1, 2], shape: [2] }], { kiln });
  const sliced = x.slice([[0, 1], null, [0, 4, 2]]);
  try {
    loss.add('oops' as unknown as number);
  } catch (e) {
    if (e instanceof KilnError) {
      const kind: KilnErrorKind = e.kind;
      const op: string = e.op;
      return kind.length + op.length + info.length + parts.length + sliced.rank + opKinds().length + reversed.length + double.arity + (checked.passed ? 1 : 0) + handles;
    }
  }
  return await loss.item();
}
`;

const tsconfig = {
  compilerOptions: {
    target: 'es2022', lib: ['es2022', 'dom'], module: 'es2022', moduleResolution: 'bundler',
    strict: true, noEmit: true, skipLibCheck: false, types: [],
  },
  files: ['main.ts'],
};

test('the .d.ts type-checks under lib es2022 without skipLibCheck', (t) => {
  const tarballs = fs.existsSync(dist) ? fs.readdirSync(dist).filter((f) => /^kiln-web-.*\.tgz$/.test(f)) : [];
  assert.equal(tarballs.length, 1, `expected one tarball in ${dist}: run \`node scripts/build.mjs --pack\``);
  const dir = tmpDir('kiln-web-types-');
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'scratch-types', private: true, type: 'module' }));
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--offline', path.join(dist, tarballs[0])], { cwd: dir, stdio: 'pipe' });
  fs.writeFileSync(path.join(dir, 'tsconfig.json'), JSON.stringify(tsconfig, null, 2));
  fs.writeFileSync(path.join(dir, 'main.ts'), program);
  const run = () => {
    try {
      execFileSync(process.execPath, [tsc, '-p', dir], { cwd: dir, stdio: 'pipe' });
      return '';
    } catch (e) {
      return `${e.stdout}${e.stderr}`;
    }
  };
  const clean = run();
  assert.equal(clean, '', `tsc reported errors:\n${clean}`);
  // The check can fail: a wrong argument type must be an error.
  fs.writeFileSync(path.join(dir, 'main.ts'), `${program}\nexport const bad: string = new Kiln();\n`);
  const broken = run();
  assert.match(broken, /main\.ts.*error TS/, 'tsc must reject a type error');
  t.diagnostic(`typescript ${JSON.parse(fs.readFileSync(path.join(webDir, 'node_modules', 'typescript', 'package.json'), 'utf8')).version}`);
});
