// One GEMM thread of the multi-threaded build (web-threads/): index.js
// starts navigator.hardwareConcurrency - 1 of these when the page is
// cross-origin isolated. Each instantiates the same module on the page's
// shared memory, says it is ready, and then runs kiln's GEMM parts for good
// (kiln-core's backend/cpu/threads.rs; it sleeps in memory.atomic.wait
// between jobs, which a Worker may do and a page's main thread may not).
import { initSync, __kilnThreadRegister, __kilnThreadRun } from './kiln_web.js';

// A Worker that is not cross-origin isolated (its script served without
// Cross-Origin-Embedder-Policy) cannot receive the shared memory: say so
// at once rather than let init() wait for it.
if (self.crossOriginIsolated !== true) {
  self.postMessage({ error: 'the thread Worker is not cross-origin isolated (serve thread-worker.js with Cross-Origin-Embedder-Policy: require-corp)' });
}
self.onmessageerror = () => self.postMessage({ error: 'the shared memory could not be received' });
self.onmessage = ({ data }) => {
  self.onmessage = null;
  try {
    initSync({ module: data.module, memory: data.memory });
    __kilnThreadRegister();
  } catch (e) {
    self.postMessage({ error: String(e && e.stack ? e.stack : e) });
    return;
  }
  self.postMessage({ ready: true });
  __kilnThreadRun();
};
