// The multi-threaded module's start-up, imported by index.js's init() only
// on cross-origin isolated pages (so the single-threaded download does not
// carry it): instantiate web-threads/ on a new shared memory, then start
// `threads - 1` Workers (thread-worker.js) on that memory and wait until
// each has registered with kiln's GEMM threads (kiln-core
// backend/cpu/threads.rs). Workers that fail are left out and reported.
import init, * as glue from './kiln_web.js';

/** One thread Worker; resolves to true, or to why it did not start. */
function startThread(module, memory) {
  return new Promise((resolve) => {
    let worker;
    const fail = (why) => { clearTimeout(timer); if (worker) worker.terminate(); resolve(why); };
    // Nothing runs kiln while init() waits, so ending a slow Worker is safe.
    const timer = setTimeout(() => fail('no answer in 30 s'), 30000);
    try {
      worker = new Worker(new URL('./thread-worker.js', import.meta.url), { type: 'module', name: 'kiln-thread' });
    } catch (e) { fail(String(e)); return; }
    worker.onerror = (e) => { e.preventDefault?.(); fail(e.message || 'its script failed to load'); };
    worker.onmessage = ({ data }) => {
      if (data && data.ready) { clearTimeout(timer); resolve(true); } else fail((data && data.error) || 'unexpected message');
    };
    worker.postMessage({ module, memory });
  });
}

/** Resolves to { glue, info } as index.js's single-threaded path does. */
export async function start(threads) {
  await init();
  const [module, memory] = glue.__kilnThreadModule();
  const started = await Promise.all(Array.from({ length: threads - 1 }, () => startThread(module, memory)));
  const failed = started.filter((r) => r !== true);
  const n = 1 + started.length - failed.length;
  const reason = failed.length
    ? `${failed.length} of ${started.length} thread Workers did not start (${failed[0]})`
    : `cross-origin isolated: the calling thread and ${n - 1} Worker${n > 2 ? 's' : ''}`;
  return { glue, info: { threads: n, module: 'multi-threaded', reason } };
}
