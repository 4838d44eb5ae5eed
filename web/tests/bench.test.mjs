// Smoke run of the benchmark page (quick counts): all four workloads run in
// headless Chromium and print BENCHMARKS.md's JSON lines. Timings are not
// asserted (the machines are shared); the format and sanity are.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runBench } from '../scripts/bench.mjs';

test('benchmark page prints W1–W4 JSON lines', async (t) => {
  const lines = await runBench({ quick: true });
  assert.equal(lines.length, 4);
  const rows = lines.map((l) => JSON.parse(l));
  assert.deepEqual(rows.map((r) => r.workload), ['W1', 'W2', 'W3', 'W4']);
  for (const r of rows) {
    t.diagnostic(JSON.stringify(r));
    assert.equal(r.system, 'kiln');
    assert.ok(['wasm-cpu', 'webgpu'].includes(r.backend), r.backend);
    assert.ok(r.min_ms > 0 && r.min_ms <= r.median_ms && r.median_ms <= r.max_ms, JSON.stringify(r));
    assert.equal(r.threads, 1);
    assert.deepEqual(Object.keys(r), ['system', 'backend', 'workload', 'median_ms', 'min_ms', 'max_ms', 'threads', 'notes']);
  }
  assert.match(rows[2].notes, /^\d+(\.\d+)? µs per op/);
  // per op = total / 1000 ops, so in µs it reads as the median in ms
  assert.ok(Math.abs(parseFloat(rows[2].notes) - rows[2].median_ms) < 0.01, rows[2].notes);
  assert.match(rows[3].notes, /^\d+(\.\d+)? GFLOP\/s/);
});
