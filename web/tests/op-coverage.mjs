// Every primitive of kiln-core's op table (`opKinds()`, read from the wasm
// at run time, so a new Rust op shows up here by itself) must be reachable
// from JavaScript. `reach[name]` builds something in graph `g` that records
// at least one node of that op; the suite's test runs each one and checks
// `g.countOps(name)` (`reach[name](g, kiln, k)`, k the package module). An op absent from `reach` must be in `exceptions` with
// the reason; anything else fails the test.

export const exceptions = {
  // An entry is 'OpName': 'why'.
  LayerNorm: 'native-only primitive: the browser build composes layer norm from ordinary ops (download size); kiln.layerNorm reaches those',
  LayerNormBackward: 'native-only primitive, the gradient of LayerNorm (see LayerNorm)',
};

const f32 = (g, values, shape) => g.tensor(new Float32Array(values), shape);
const img = (g) => f32(g, Array.from({ length: 16 }, (_, i) => (i * 7) % 5 - 2), [1, 1, 4, 4]);

export const reach = {
  Input: (g) => f32(g, [1, 2], [2]),
  Param: (g, kiln) => { const p = kiln.param('p', new Float32Array([1, 2]), [2]); const t = g.param(p); p.free(); return t; },
  Full: (g) => g.full([2], 3),
  Arange: (g) => g.arange(0, 1, 4),
  RandUniform: (g) => g.randUniform([3], 7),
  RandNormal: (g) => g.randNormal([3], 7),
  Neg: (g) => f32(g, [1], [1]).neg(),
  Abs: (g) => f32(g, [1], [1]).abs(),
  Exp: (g) => f32(g, [1], [1]).exp(),
  Log: (g) => f32(g, [1], [1]).log(),
  Sqrt: (g) => f32(g, [1], [1]).sqrt(),
  Recip: (g) => f32(g, [1], [1]).recip(),
  Sin: (g) => f32(g, [1], [1]).sin(),
  Cos: (g) => f32(g, [1], [1]).cos(),
  Tanh: (g) => f32(g, [1], [1]).tanh(),
  Sigmoid: (g) => f32(g, [1], [1]).sigmoid(),
  Relu: (g) => f32(g, [1], [1]).relu(),
  Erf: (g) => f32(g, [1], [1]).erf(),
  Erfc: (g) => f32(g, [1], [1]).erfc(),
  Sign: (g) => f32(g, [1], [1]).sign(),
  Log1p: (g) => f32(g, [1], [1]).log1p(),
  Expm1: (g) => f32(g, [1], [1]).expm1(),
  Softsign: (g) => f32(g, [1], [1]).softsign(),
  Gelu: (g) => f32(g, [1], [1]).gelu(),
  GeluDerivative: (g) => f32(g, [1], [1]).geluDerivative(),
  Cast: (g) => f32(g, [1], [1]).cast('int32'),
  Add: (g) => f32(g, [1], [1]).add(1),
  Sub: (g) => f32(g, [1], [1]).sub(1),
  Mul: (g) => f32(g, [1], [1]).mul(2),
  Div: (g) => f32(g, [1], [1]).div(2),
  Pow: (g) => f32(g, [1], [1]).pow(2),
  Maximum: (g) => f32(g, [1], [1]).maximum(0),
  Minimum: (g) => f32(g, [1], [1]).minimum(0),
  Equal: (g) => f32(g, [1], [1]).eq(0),
  NotEqual: (g) => f32(g, [1], [1]).ne(0),
  Less: (g) => f32(g, [1], [1]).lt(0),
  LessEqual: (g) => f32(g, [1], [1]).le(0),
  Greater: (g) => f32(g, [1], [1]).gt(0),
  GreaterEqual: (g) => f32(g, [1], [1]).ge(0),
  Where: (g) => { const x = f32(g, [1, -1], [2]); return x.gt(0).where(x, 0); },
  Sum: (g) => f32(g, [1, 2], [2]).sum(),
  Max: (g) => f32(g, [1, 2], [2]).max(),
  Min: (g) => f32(g, [1, 2], [2]).min(),
  Prod: (g) => f32(g, [1, 2], [2]).prod(),
  ArgMax: (g) => f32(g, [1, 2], [2]).argmax(0),
  ArgMin: (g) => f32(g, [1, 2], [2]).argmin(0),
  MatMul: (g) => f32(g, [1, 2, 3, 4], [2, 2]).matmul(f32(g, [1, 0, 0, 1], [2, 2])),
  Reshape: (g) => f32(g, [1, 2, 3, 4], [2, 2]).reshape([4]),
  Permute: (g) => f32(g, [1, 2, 3, 4, 5, 6], [1, 2, 3]).permute([2, 0, 1]),
  Expand: (g) => f32(g, [1, 2], [1, 2]).expand([3, 2]),
  Slice: (g) => f32(g, [1, 2, 3, 4, 5, 6], [2, 3]).slice([[0, 1], [0, 3, 2]]),
  SliceBackward: (g) => f32(g, [1, 2], [1, 2]).sliceBackward([2, 3], [[0, 1], [0, 3, 2]]),
  Concat: (g) => g.concat([f32(g, [1], [1]), f32(g, [2], [1])], 0),
  IndexSelect: (g) => f32(g, [1, 2, 3], [3]).indexSelect(0, g.tensor(new Int32Array([2, 0]), [2])),
  ScatterAdd: (g) => g.zeros([3]).scatterAdd(0, g.tensor(new Int32Array([2, 0]), [2]), f32(g, [5, 6], [2])),
  Im2Col: (g) => img(g).im2col(2),
  Col2Im: (g) => img(g).im2col(2).col2im([4, 4], 2),
  MaxPool2d: (g) => img(g).maxPool2d(2),
  CausalSoftmax: (g) => f32(g, [1, 2, 3, 4], [2, 2]).causalSoftmax(),
  CumSum: (g) => f32(g, [1, 2, 3, 4], [2, 2]).cumsum(1, true, true),
  TopK: (g) => f32(g, [1, 4, 3, 2], [2, 2]).topK(1)[1],
  // The Custom kind's stand-in (registered in Rust); JS defines its own with k.customOp.
  CustomCube: (g, kiln, k) => k.findCustomOp('CustomCube').apply([f32(g, [1.5], [1])]),
  MaxPool2dBackward: (g) => { const x = img(g); return x.maxPool2dBackward(x.maxPool2d(2), 2); },
};
