// Per-step tensor handles without the garbage collector.
//
// A `Tensor` is a wasm-bindgen object: a JS wrapper over a few bytes of
// wasm memory (the graph, the step, the node id), which are released when
// `free()` is called or when the GC finalises the wrapper. A training loop
// makes dozens of handles per step; left to the GC, wasm memory grows by
// megabytes before the finalisers catch up (and linear memory never
// shrinks). Handles only live for one step anyway, so the entry points
// free them when the step ends: every Tensor the API returns is noted
// under its graph, and `graph.reset()` / `graph.free()` free the handles
// of the step they end. Using such a handle afterwards gives the same
// `StaleTensor` KilnError as before (recorded here, since the handle's
// wasm side is gone): `isAlive` is false, `step` and `graphId` still read.
//
// An object freed by hand (`free()`, or `using`) is refused the same way:
// any use, or passing it to another call, is a KilnError naming its class
// (wasm-bindgen's glue would throw a bare "null pointer passed to rust"),
// and a second `free()` does nothing.
//
// `scopeHandles(glue, KilnError)` patches the glue's classes in place and
// returns the module's functions wrapped the same way.

export function scopeHandles(glue, KilnError) {
  const { Tensor, Graph } = glue;
  const steps = new Map();        // graph id -> Set of the handles of its current step
  const retired = new WeakMap();  // freed handle -> { graph, step, now } or { graph, freed: true }
  const graphs = new FinalizationRegistry((id) => steps.delete(id));
  const freeTensor = Tensor.prototype.free;
  // The glue's classes by constructor, with their exported names.
  const classes = new Map();
  for (const [name, value] of Object.entries(glue)) {
    if (typeof value === 'function' && value.prototype && typeof value.prototype.free === 'function') classes.set(value, name);
  }
  // A class instance whose wasm side is gone (wasm-bindgen zeroes the pointer).
  const isFreed = (v) => v !== null && typeof v === 'object' && classes.has(v.constructor) && v.__wbg_ptr === 0;
  const freedError = (v, what) => {
    const name = classes.get(v.constructor);
    const kind = v instanceof Tensor || v instanceof Graph ? 'StaleTensor' : 'InvalidArgument';
    const who = what === 'this' ? `this ${name}` : `a ${name} passed as an argument`;
    return new KilnError(kind, name, `${who} was freed with free() and can no longer be used`);
  };

  const note = (value) => {
    if (value instanceof Tensor) {
      const id = value.graphId;
      let set = steps.get(id);
      if (!set) steps.set(id, (set = new Set()));
      set.add(value);
    } else if (value instanceof Graph) {
      graphs.register(value, value.id);
    } else if (Array.isArray(value)) {
      for (const v of value) if (v instanceof Tensor) note(v);
    }
    return value;
  };

  // Free the handles of graph `id`'s ending step; `info` is what stale use reports.
  const retire = (id, info) => {
    const set = steps.get(id);
    if (!set) return;
    steps.delete(id);
    for (const t of set) {
      if (retired.has(t)) continue;
      const step = t.step;
      retired.set(t, { graph: id, step, ...info });
      freeTensor.call(t);
    }
  };

  const stale = (info, what) => new KilnError('StaleTensor', info.freed ? 'Graph' : 'Tensor', info.freed
    ? `graph #${info.graph} was freed; make a new graph with kiln.graph()`
    : `${what} belongs to step ${info.step} of graph #${info.graph}, which was reset and is now at step ${info.now}; ` +
      'tensors live for one step: make new ones after graph.reset()');

  const staleArgument = (args) => {
    for (const a of args) {
      const info = a instanceof Tensor ? retired.get(a) : undefined;
      if (info) return stale(info, 'the other operand');
      if (isFreed(a)) return freedError(a, 'argument');
      if (Array.isArray(a)) {
        const bad = staleArgument(a);
        if (bad) return bad;
      }
    }
    return null;
  };

  // A wrong JavaScript type the glue cannot convert: a symbol or a BigInt
  // (no kiln function takes one; the glue's number conversion would throw a
  // bare TypeError), or what the glue's guards refuse (scripts/guard-glue.mjs:
  // a non-string for a string, a non-array for an array, another class's
  // object). Both become the InvalidArgument KilnError of any bad argument.
  const wrongType = (args, name) => {
    for (let i = 0; i < args.length; i++) {
      const t = typeof args[i];
      if (t === 'symbol' || t === 'bigint') {
        return new KilnError('InvalidArgument', name, `${name}: argument ${i + 1} is a ${t}, which no kiln function takes`);
      }
    }
    return null;
  };
  const call = (fn, self, args, name) => {
    try {
      return fn.apply(self, args);
    } catch (e) {
      if (e instanceof TypeError && e.kilnArgument) throw new KilnError('InvalidArgument', name, `${name}: ${e.message}`);
      throw e;
    }
  };

  const promiseMethods = new Set(['toArray', 'item']);
  const wrap = (fn, name, ofTensor) => function (...args) {
    const info = ofTensor ? retired.get(this) : undefined;
    if (info || isFreed(this)) {
      const error = info ? stale(info, 'this tensor') : freedError(this, 'this');
      if (promiseMethods.has(name)) return Promise.reject(error);
      throw error;
    }
    const bad = staleArgument(args) ?? wrongType(args, name);
    if (bad) throw bad;
    return note(call(fn, this, args, name));
  };

  for (const value of classes.keys()) {
    const ofTensor = value === Tensor;
    const proto = value.prototype;
    // free() twice is a no-op (Tensor's and Graph's own free below too).
    const ownFree = proto.free;
    if (!ofTensor && value !== Graph) {
      proto.free = function () { if (!isFreed(this)) ownFree.call(this); };
      if (Symbol.dispose && proto[Symbol.dispose]) proto[Symbol.dispose] = proto.free;
    }
    for (const key of Object.getOwnPropertyNames(proto)) {
      if (key === 'constructor' || key === 'free' || key === '__destroy_into_raw') continue;
      const d = Object.getOwnPropertyDescriptor(proto, key);
      if (typeof d.value === 'function') {
        Object.defineProperty(proto, key, { ...d, value: wrap(d.value, key, ofTensor) });
      } else if (d.get) {
        // Getters: a Tensor they return is noted too; a freed handle's
        // getters give what is still known, or the stale error.
        const get = d.get;
        const known = { isAlive: () => false, step: (i) => i.step, graphId: (i) => i.graph };
        Object.defineProperty(proto, key, {
          ...d,
          get() {
            const info = ofTensor ? retired.get(this) : undefined;
            if (info) {
              if (known[key]) return known[key](info);
              throw stale(info, 'this tensor');
            }
            if (isFreed(this)) {
              if (key === 'isAlive') return false;
              throw freedError(this, 'this');
            }
            return note(get.call(this));
          },
          // Setters: the same checks as a method's argument.
          ...(d.set ? { set: wrap(d.set, key, ofTensor) } : {}),
        });
      }
    }
    for (const key of Object.getOwnPropertyNames(value)) {
      const d = Object.getOwnPropertyDescriptor(value, key);
      if (typeof d.value === 'function' && key !== '__wrap' && !key.startsWith('__')) {
        Object.defineProperty(value, key, { ...d, value: wrap(d.value, key, false) });
      }
    }
  }

  // free() of one handle: it leaves its step's set; after the step has
  // ended (and freed it) it is a no-op.
  Tensor.prototype.free = function () {
    if (isFreed(this)) return; // by hand, or with its step
    steps.get(this.graphId)?.delete(this);
    freeTensor.call(this);
  };
  if (Symbol.dispose && Tensor.prototype[Symbol.dispose]) Tensor.prototype[Symbol.dispose] = Tensor.prototype.free;

  // The step ends: its handles are freed.
  const reset = Graph.prototype.reset;
  Graph.prototype.reset = function () {
    const id = this.id;
    reset.call(this);
    retire(id, { now: this.step });
  };
  const free = Graph.prototype.free;
  Graph.prototype.free = function () {
    if (isFreed(this)) return;
    const id = this.id;
    free.call(this);
    retire(id, { freed: true });
  };

  const functions = {};
  for (const [name, value] of Object.entries(glue)) {
    if (typeof value === 'function' && !classes.has(value)) {
      functions[name] = wrap(value, name, false);
    } else if (classes.has(value) && /\bconstructor\s*\(/.test(Function.prototype.toString.call(value))) {
      // A class users construct (`new Adam(...)`) gets the same argument
      // checks through a Proxy; `instanceof`, the statics and the prototype
      // are the class's own, and `constructor` names the Proxy.
      const proxy = new Proxy(value, {
        construct(target, args, newTarget) {
          const bad = staleArgument(args) ?? wrongType(args, name);
          if (bad) throw bad;
          return call((...a) => Reflect.construct(target, a, newTarget === proxy ? target : newTarget), null, args, name);
        },
      });
      Object.defineProperty(value.prototype, 'constructor', { value: proxy, writable: true, configurable: true });
      classes.set(proxy, name);
      functions[name] = proxy;
    }
  }
  return functions;
}
