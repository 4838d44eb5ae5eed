// The worker side of a demo: requests from the page ({ id, type, args })
// are answered with { id, result } or { id, error }; `emit` posts events
// ({ event, ... }) such as training progress. Every handler runs under one
// lock, so a prediction asked for while training runs between two steps,
// never in the middle of one (the training loop takes the lock per step).
let lock = Promise.resolve();

/** Run `fn` when everything queued before it has finished. */
export function exclusive(fn) {
  const p = lock.then(fn);
  lock = p.catch(() => {});
  return p;
}

export function emit(event, fields = {}, transfer = []) {
  self.postMessage({ event, ...fields }, transfer);
}

/** A result with transferable buffers: `return transferable(bytes, [bytes.buffer])`. */
export function transferable(result, transfer) {
  return { __transfer: true, result, transfer };
}

/** Answer the page's requests with `handlers[type](args)`. `long` names the
 * handlers that manage the lock themselves (the training loop). */
export function serve(handlers, long = []) {
  self.onmessage = async ({ data }) => {
    const { id, type, args } = data;
    try {
      if (!handlers[type]) throw new Error(`unknown request '${type}'`);
      const run = () => handlers[type](args ?? {});
      const out = await (long.includes(type) ? run() : exclusive(run));
      if (out && out.__transfer) self.postMessage({ id, result: out.result }, out.transfer);
      else self.postMessage({ id, result: out });
    } catch (e) {
      self.postMessage({ id, error: e && e.message ? e.message : String(e), kind: e?.kind ?? null });
    }
  };
}

/** A macrotask boundary: lets queued requests (predict, stop, save) in. */
export const yieldToMessages = () => new Promise((resolve) => setTimeout(resolve, 0));

/** The bytes of a served file, gunzipped when they start with gzip's magic. */
export async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  const bytes = new Uint8Array(await response.arrayBuffer());
  if (bytes[0] !== 0x1f || bytes[1] !== 0x8b) return bytes;
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}
