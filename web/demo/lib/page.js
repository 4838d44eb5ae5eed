// The page side of the worker demos: a typed request/response channel to
// the worker, the device badge, the loss chart, checkpoint download and
// upload, and the event-loop gap monitor the browser tests read.

/** Start `url` as a module worker; `call(type, args, transfer)` returns a
 * Promise of the worker's answer; `on(event, fn)` receives its events. */
export function startWorker(url) {
  const worker = new Worker(url, { type: 'module' });
  const pending = new Map();
  const listeners = new Map();
  let next = 1;
  worker.onmessage = ({ data }) => {
    if (data.event) {
      for (const fn of listeners.get(data.event) ?? []) fn(data);
      return;
    }
    const p = pending.get(data.id);
    pending.delete(data.id);
    if (!p) return;
    if ('error' in data) p.reject(Object.assign(new Error(data.error), { kind: data.kind }));
    else p.resolve(data.result);
  };
  worker.onerror = (e) => {
    // A module that fails to load gives an event without a message.
    const error = new Error(`worker ${url}: ${e.message ?? 'failed to load (see the console)'}`);
    for (const p of pending.values()) p.reject(error);
    pending.clear();
    for (const fn of listeners.get('error') ?? []) fn({ error: error.message });
  };
  return {
    call(type, args = {}, transfer = []) {
      const id = next++;
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject });
        worker.postMessage({ id, type, args }, transfer);
      });
    },
    on(event, fn) {
      if (!listeners.has(event)) listeners.set(event, []);
      listeners.get(event).push(fn);
    },
    worker,
  };
}

export function showDevice(box, info) {
  box.className = `device ${info.device}`;
  box.textContent = info.device === 'webgpu'
    ? `WebGPU · ${info.deviceInfo} · training in a Web Worker`
    : `CPU (WebAssembly) · ${info.deviceInfo}${info.fallbackReason ? ` — ${info.fallbackReason}` : ''} · training in a Web Worker`;
}

/** While `active()` holds: the longest task the page's main thread ran
 * (`demo.maxTaskMs`, from the Long Tasks API: tasks over 50 ms, 0 if none),
 * which is what the page itself blocks for, and the longest gap between
 * 20 ms timer ticks (`demo.maxGapMs`), which also counts the time the
 * machine gave the main thread no CPU (a loaded box, SwiftShader's threads). */
export function watchEventLoop(demo, active) {
  demo.maxTaskMs = 0;
  demo.longTasksObserved = PerformanceObserver.supportedEntryTypes?.includes('longtask') ?? false;
  if (demo.longTasksObserved) {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) if (active()) demo.maxTaskMs = Math.max(demo.maxTaskMs, e.duration);
    }).observe({ type: 'longtask' });
  }
  let last = performance.now();
  setInterval(() => {
    const now = performance.now();
    if (active()) {
      demo.maxGapMs = Math.max(demo.maxGapMs, now - last);
      // The long gaps, with when they happened (ms since the page loaded).
      if (now - last > 150) (demo.longGaps ??= []).push([Math.round(last), Math.round(now - last)]);
    }
    last = now;
  }, 20);
}

/** Loss per step (faint), its moving average, and optional accuracy points
 * ({ step, accuracy } in [0, 1], right axis). */
export function drawChart(canvas, losses, accuracies = [], maxLoss = null) {
  const ctx = canvas.getContext('2d');
  const W = canvas.width, H = canvas.height, L = 46, R = 46, T = 14, B = 30;
  ctx.clearRect(0, 0, W, H);
  ctx.font = '11px system-ui, sans-serif';
  ctx.strokeStyle = '#ddd';
  ctx.fillStyle = '#666';
  const top = maxLoss ?? Math.max(0.5, ...losses.slice(0, 5));
  const steps = Math.max(losses.length, 10);
  for (let i = 0; i <= 5; i++) {
    const y = T + (H - T - B) * (i / 5);
    ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(W - R, y); ctx.stroke();
    ctx.textAlign = 'right'; ctx.fillText((top * (1 - i / 5)).toFixed(2), L - 4, y + 4);
    if (accuracies.length) { ctx.textAlign = 'left'; ctx.fillText(`${100 - i * 20}%`, W - R + 4, y + 4); }
  }
  ctx.textAlign = 'center';
  ctx.fillText('training step', (L + W - R) / 2, H - 8);
  const x = (i) => L + (W - L - R) * (i / steps);
  const y = (v) => T + (H - T - B) * (1 - Math.min(v, top) / top);
  ctx.strokeStyle = 'rgba(194,65,12,.25)';
  ctx.beginPath();
  losses.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
  ctx.stroke();
  ctx.strokeStyle = '#c2410c'; ctx.lineWidth = 2;
  ctx.beginPath();
  let ema = null;
  losses.forEach((v, i) => { ema = ema === null ? v : 0.9 * ema + 0.1 * v; i ? ctx.lineTo(x(i), y(ema)) : ctx.moveTo(x(i), y(ema)); });
  ctx.stroke();
  ctx.lineWidth = 1;
  if (accuracies.length) {
    const ya = (a) => T + (H - T - B) * (1 - a);
    ctx.strokeStyle = '#15803d'; ctx.fillStyle = '#15803d';
    ctx.beginPath();
    accuracies.forEach(({ step, accuracy }, i) => (i ? ctx.lineTo(x(step), ya(accuracy)) : ctx.moveTo(x(step), ya(accuracy))));
    ctx.stroke();
    accuracies.forEach(({ step, accuracy }) => { ctx.beginPath(); ctx.arc(x(step), ya(accuracy), 3, 0, 7); ctx.fill(); });
  }
  ctx.textAlign = 'left';
  if (accuracies.length) { ctx.fillStyle = '#15803d'; ctx.fillText('test accuracy', L + 40, T + 12); }
  ctx.fillStyle = '#c2410c'; ctx.fillText('loss', L + 6, T + 12);
}

/** Wire a download button and a file input to the worker's 'save' (resolves
 * to safetensors bytes) and 'load' (takes them) requests. */
export function checkpointButtons({ rpc, download, upload, filename, onLoaded, onError }) {
  download.onclick = async () => {
    try {
      const bytes = await rpc.call('save');
      const url = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
      const a = Object.assign(document.createElement('a'), { href: url, download: filename });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) {
      onError(e);
    }
  };
  upload.onchange = async () => {
    const file = upload.files[0];
    if (!file) return;
    try {
      const bytes = new Uint8Array(await file.arrayBuffer());
      await rpc.call('load', { bytes }, [bytes.buffer]);
      onLoaded(file);
    } catch (e) {
      onError(e);
    } finally {
      upload.value = '';
    }
  };
}
