//! Convolution and pooling layers, composed from Im2Col/Col2Im, MatMul and
//! the pooling ops (NCHW layout, PyTorch's parameter shapes).

use super::layers::uniform_param;
use super::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::host_rng::SplitMix64;
use crate::op::Window2d;
use crate::param::Param;
use crate::shape::{check_shape, checked_numel};

/// Options shared by the convolution layers: stride, padding, dilation
/// (height, width), groups, bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvOptions {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub bias: bool,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1, bias: true }
    }
}

#[track_caller]
fn dims4(op: &'static str, x: &Tensor<'_>, channels: usize) -> Result<[usize; 4]> {
    let d = x.dims();
    if d.len() != 4 || d[1] != channels {
        return Err(Error::shape(op, format!("expects [N, {channels}, H, W], got {:?}", d.as_slice())));
    }
    Ok([d[0], d[1], d[2], d[3]])
}

/// A convolution's weight (`weight_dims`) and, when `bias`, its bias [out]:
/// PyTorch's default initialisation, uniform ±1/√fan_in with fan_in = the
/// weight's elements per output channel (`weight_dims[0]` for a
/// convolution, `weight_dims[1]` for a transposed one), f32, weight first.
#[track_caller]
fn conv_params(
    device: &Device,
    op: &'static str,
    weight_dims: [usize; 4],
    fan_out_axis: usize,
    bias: bool,
    out_channels: usize,
    seed: u64,
) -> Result<(Param, Option<Param>)> {
    let numel = check_shape(op, &weight_dims, DType::F32)?;
    let fan_in = numel / weight_dims[fan_out_axis];
    let bound = 1.0 / (fan_in as f64).sqrt();
    let mut rng = SplitMix64::new(seed);
    let weight = uniform_param(device, op, "weight", &weight_dims, bound, &mut rng, DType::F32)?;
    let bias = match bias {
        true => Some(uniform_param(device, op, "bias", &[out_channels], bound, &mut rng, DType::F32)?),
        false => None,
    };
    Ok((weight, bias))
}

/// `y` [N, out, H, W] plus the bias broadcast over N, H and W, if any.
fn add_bias<'g>(y: Tensor<'g>, bias: &Option<Param>, out_channels: usize) -> Result<Tensor<'g>> {
    match bias {
        Some(b) => y.add(y.graph().param(b)?.reshape_to(&[1, out_channels, 1, 1])?),
        None => Ok(y),
    }
}

fn weight_and_bias(weight: &Param, bias: &Option<Param>) -> Vec<Param> {
    let mut p = vec![weight.clone()];
    p.extend(bias.clone());
    p
}

/// Whether a convolution (groups = 1) multiplies the whole batch at once:
/// the columns folded into [in·k, N·L] (`Tensor::im2col_folded`), one
/// product with the weight, and the output permuted to [N, out, ...].
/// Its weight gradient is then one product with a contraction over N·L
/// (split into chunks summed by the rule of docs/reductions.md), instead
/// of N products with a contraction over L each and a sum over the batch;
/// the input gradient one product too. That pays when each sample's
/// contraction is short against the rows it fills (L < in·k: W2's second
/// layer, 121 positions for 288 rows, where the per-sample weight
/// gradients ran at a third of the folded product's speed); when it is not
/// (W2's first layer, 676 positions for 9 rows: products bound by writing
/// their output), the permutes of the output and its gradient cost more
/// than folding saves. Never in portable numerics, whose sums follow the
/// browser's CPU path (always portable), which multiplies sample by sample
/// and whose kernels have no folded layout; the browser's WebGPU path folds.
fn fold_batch(graph: &crate::graph::Graph, rows: usize, positions: usize) -> bool {
    positions < rows && !graph.device().backend().portable_numerics()
}

/// The convolution of `x` [N, in, H, W] with `weight` [out, in·k] as one
/// product: [out, in·k] · [in·k, N·L] → [out, N, oh, ow] → [N, out, oh, ow].
fn conv_folded<'g>(x: Tensor<'g>, weight: Tensor<'g>, window: Window2d, [oh, ow]: [usize; 2]) -> Result<Tensor<'g>> {
    let (n, out) = (x.dims()[0], weight.dims()[0]);
    let y = weight.matmul(x.im2col_folded(window)?)?;
    y.reshape_to(&[out, n, oh, ow])?.permute(&[1, 0, 2, 3])
}

/// 2-D convolution: weight [out, in/groups, kh, kw], bias [out].
/// Computed as Im2Col → MatMul (batched over groups) → reshape.
pub struct Conv2d {
    pub weight: Param,
    pub bias: Option<Param>,
    in_channels: usize,
    out_channels: usize,
    kernel: [usize; 2],
    window: Window2d,
    groups: usize,
}

impl Conv2d {
    /// PyTorch's default initialisation (uniform ±1/√fan_in), f32.
    #[track_caller]
    pub fn new(
        device: &Device,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: ConvOptions,
        seed: u64,
    ) -> Result<Conv2d> {
        let g = options.groups;
        if g == 0 || in_channels == 0 || out_channels == 0 || in_channels % g != 0 || out_channels % g != 0 {
            return Err(Error::invalid(
                "Conv2d",
                format!("channels {in_channels}→{out_channels} must be positive and divisible by groups {g}"),
            ));
        }
        let window = Window2d::new(kernel, options.stride, options.padding, options.dilation)?;
        let weight_dims = [out_channels, in_channels / g, kernel[0], kernel[1]];
        let (weight, bias) = conv_params(device, "Conv2d", weight_dims, 0, options.bias, out_channels, seed)?;
        Ok(Conv2d { weight, bias, in_channels, out_channels, kernel, window, groups: g })
    }
}

impl Module for Conv2d {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let [n, _, h, w] = dims4("Conv2d", &x, self.in_channels)?;
        let graph = x.graph();
        let Some([oh, ow]) = self.window.output_size([h, w]) else {
            return Err(Error::shape("Conv2d", format!("a {:?} kernel does not fit a {h}x{w} input", self.kernel)));
        };
        let (g, k) = (self.groups, self.window.kernel_elements());
        let weight = graph.param(&self.weight)?;
        let y = if g == 1 {
            let weight = weight.reshape_to(&[self.out_channels, self.in_channels * k])?;
            if fold_batch(graph, self.in_channels * k, oh * ow) {
                let y = conv_folded(x, weight, self.window, [oh, ow])?;
                return add_bias(y, &self.bias, self.out_channels);
            }
            // [out, in·k] · [N, in·k, L] → [N, out, L]
            weight.matmul(x.im2col(self.window)?)?
        } else {
            let cols = x.im2col(self.window)?;
            let cols = cols.reshape_to(&[n, g, self.in_channels / g * k, oh * ow])?;
            let weight = weight.reshape_to(&[g, self.out_channels / g, self.in_channels / g * k])?;
            weight.matmul(cols)?
        };
        let y = y.reshape_to(&[n, self.out_channels, oh, ow])?;
        add_bias(y, &self.bias, self.out_channels)
    }
    fn parameters(&self) -> Vec<Param> {
        weight_and_bias(&self.weight, &self.bias)
    }
}

/// Transposed 2-D convolution (groups = 1): weight [in, out, kh, kw], bias
/// [out]; computed as MatMul → Col2Im, the adjoint of Conv2d's unfolding.
pub struct ConvTranspose2d {
    pub weight: Param,
    pub bias: Option<Param>,
    in_channels: usize,
    out_channels: usize,
    kernel: [usize; 2],
    window: Window2d,
    output_padding: [usize; 2],
}

impl ConvTranspose2d {
    /// `options.groups` must be 1; `output_padding` adds rows/columns at the
    /// bottom/right of the output (must be smaller than the stride).
    #[track_caller]
    pub fn new(
        device: &Device,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: ConvOptions,
        output_padding: [usize; 2],
        seed: u64,
    ) -> Result<ConvTranspose2d> {
        if options.groups != 1 {
            return Err(Error::unsupported("ConvTranspose2d", "groups other than 1 are not implemented"));
        }
        if in_channels == 0 || out_channels == 0 {
            return Err(Error::invalid("ConvTranspose2d", "channel counts must be positive"));
        }
        if (0..2).any(|a| output_padding[a] >= options.stride[a]) {
            return Err(Error::invalid(
                "ConvTranspose2d",
                format!("output_padding {output_padding:?} must be smaller than the stride"),
            ));
        }
        let window = Window2d::new(kernel, options.stride, options.padding, options.dilation)?;
        let weight_dims = [in_channels, out_channels, kernel[0], kernel[1]];
        let (weight, bias) = conv_params(device, "ConvTranspose2d", weight_dims, 0, options.bias, out_channels, seed)?;
        Ok(ConvTranspose2d { weight, bias, in_channels, out_channels, kernel, window, output_padding })
    }
}

impl Module for ConvTranspose2d {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let [n, _, h, w] = dims4("ConvTranspose2d", &x, self.in_channels)?;
        let graph = x.graph();
        // (size - 1)·stride + dilation·(kernel - 1) + 1 + output_padding -
        // 2·padding, in u128 (each term is below 2^64).
        let image = [0, 1].map(|a| {
            let s = self.window.stride[a] as u128;
            let d = self.window.dilation[a] as u128;
            let p = self.window.pad_begin[a] as u128;
            let size = [h, w][a] as u128;
            let full =
                size.saturating_sub(1) * s + d * (self.kernel[a] as u128 - 1) + 1 + self.output_padding[a] as u128;
            full.checked_sub(2 * p).map(|v| usize::try_from(v).unwrap_or(usize::MAX))
        });
        let (Some(oh), Some(ow)) = (image[0], image[1]) else {
            return Err(Error::shape("ConvTranspose2d", "padding removes the whole output"));
        };
        if h == 0 || w == 0 {
            return Err(Error::shape("ConvTranspose2d", format!("the input image {h}x{w} is empty")));
        }
        let k = self.window.kernel_elements();
        let weight = graph.param(&self.weight)?.reshape_to(&[self.in_channels, self.out_channels * k])?;
        // [in, out·k]ᵀ · [N, in, H·W] → [N, out·k, H·W], then fold.
        let cols = weight.matmul_t(x.reshape_to(&[n, self.in_channels, h * w])?, true, false)?;
        let y = cols.col2im([oh, ow], self.window)?;
        add_bias(y, &self.bias, self.out_channels)
    }
    fn parameters(&self) -> Vec<Param> {
        weight_and_bias(&self.weight, &self.bias)
    }
}

/// Max pooling layer (see `Tensor::max_pool2d`).
#[derive(Clone, Copy, Debug)]
pub struct MaxPool2d {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub ceil_mode: bool,
}

impl MaxPool2d {
    /// Kernel `k`, stride `k`, no padding (the common case).
    pub fn new(k: usize) -> MaxPool2d {
        MaxPool2d { kernel: [k, k], stride: [k, k], padding: [0, 0], dilation: [1, 1], ceil_mode: false }
    }
}

impl Module for MaxPool2d {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        x.max_pool2d(self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode)
    }
    fn parameters(&self) -> Vec<Param> {
        Vec::new()
    }
}

/// Average pooling; padding counts as zeros in the average (PyTorch's
/// default count_include_pad = true).
#[derive(Clone, Copy, Debug)]
pub struct AvgPool2d {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl AvgPool2d {
    pub fn new(k: usize) -> AvgPool2d {
        AvgPool2d { kernel: [k, k], stride: [k, k], padding: [0, 0] }
    }
}

/// Mean over each window, as Im2Col → mean.
#[track_caller]
fn avg_pool<'g>(x: Tensor<'g>, window: Window2d) -> Result<Tensor<'g>> {
    let d = x.dims();
    if d.len() != 4 {
        return Err(Error::shape("AvgPool2d", format!("expects NCHW, got {:?}", d.as_slice())));
    }
    let Some([oh, ow]) = window.output_size([d[2], d[3]]) else {
        return Err(Error::shape("AvgPool2d", format!("window {:?} does not fit {:?}", window.kernel, d.as_slice())));
    };
    let k = window.kernel_elements();
    x.im2col(window)?.reshape_to(&[d[0], d[1], k, oh * ow])?.mean(&[2], false)?.reshape_to(&[d[0], d[1], oh, ow])
}

impl Module for AvgPool2d {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        avg_pool(x, Window2d::new(self.kernel, self.stride, self.padding, [1, 1])?)
    }
    fn parameters(&self) -> Vec<Param> {
        Vec::new()
    }
}

/// Average pooling to a fixed output size. Window i along an axis covers
/// [⌊i·H/out⌋, ⌈(i+1)·H/out⌉), as in PyTorch.
#[derive(Clone, Copy, Debug)]
pub struct AdaptiveAvgPool2d {
    pub output: [usize; 2],
}

impl Module for AdaptiveAvgPool2d {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let d = x.dims();
        let [oh, ow] = self.output;
        if d.len() != 4 || oh == 0 || ow == 0 || d[2] < oh || d[3] < ow {
            return Err(Error::shape(
                "AdaptiveAvgPool2d",
                format!("cannot pool {:?} to {:?}", d.as_slice(), self.output),
            ));
        }
        let (h, w) = (d[2], d[3]);
        if h % oh == 0 && w % ow == 0 {
            let k = [h / oh, w / ow];
            return avg_pool(x, Window2d::new(k, k, [0, 0], [1, 1])?);
        }
        // Uneven windows: one slice and mean per output row and column.
        // Loops, not closures, keep the caller's location on errors; the
        // bounds are computed in u128 (i·h may exceed usize).
        let start = |i: usize, n: usize, out: usize| (i as u128 * n as u128 / out as u128) as usize;
        let end = |i: usize, n: usize, out: usize| ((i as u128 + 1) * n as u128).div_ceil(out as u128) as usize;
        let mut rows = Vec::with_capacity(oh);
        for i in 0..oh {
            let band = x.slice_axis(2, start(i, h, oh), end(i, h, oh), 1)?;
            let mut cells = Vec::with_capacity(ow);
            for j in 0..ow {
                cells.push(band.slice_axis(3, start(j, w, ow), end(j, w, ow), 1)?.mean(&[2, 3], true)?);
            }
            rows.push(Tensor::concat(&cells, 3)?);
        }
        Tensor::concat(&rows, 2)
    }
    fn parameters(&self) -> Vec<Param> {
        Vec::new()
    }
}

/// [N, ...] → [N, product of the rest].
#[derive(Clone, Copy, Debug, Default)]
pub struct Flatten;

impl Module for Flatten {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let d = x.dims();
        if d.is_empty() {
            return Err(Error::shape("Flatten", "cannot flatten a rank-0 tensor"));
        }
        x.reshape_to(&[d[0], d[1..].iter().product()])
    }
    fn parameters(&self) -> Vec<Param> {
        Vec::new()
    }
}

/// [N, features] → [N, ...dims]: flat rows back into images (the datasets
/// store images as rows).
#[derive(Clone, Debug)]
pub struct Unflatten {
    pub dims: Vec<usize>,
}

impl Module for Unflatten {
    fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let d = x.dims();
        let features = checked_numel("Unflatten", &self.dims)?;
        if d.len() != 2 || d[1] != features {
            return Err(Error::shape(
                "Unflatten",
                format!("expects [N, {features}] to unflatten into {:?}, got {:?}", self.dims, d.as_slice()),
            ));
        }
        let mut dims = vec![d[0]];
        dims.extend(&self.dims);
        x.reshape_to(&dims)
    }
    fn parameters(&self) -> Vec<Param> {
        Vec::new()
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::gradcheck::{gradcheck, gradgradcheck, BoxedFn, CheckInput, GradcheckOptions};
    use crate::graph::Graph;
    use crate::op::Op;

    /// The folded convolution (one product for the batch) against the
    /// per-sample one it replaces where it pays: the same values and
    /// gradients up to summation order (f32), and its own first and second
    /// derivatives against finite differences (f64), through the folded
    /// Im2Col and its adjoint (whose gradient is the folded Im2Col again).
    #[test]
    fn the_folded_convolution_is_the_per_sample_one() {
        let device = Device::cpu();
        let window = Window2d::new([3, 2], [1, 2], [1, 0], [1, 1]).unwrap();
        let (n, c, out, h, w) = (3, 4, 5, 5, 6);
        let [oh, ow] = window.output_size([h, w]).unwrap();
        let rows = c * window.kernel_elements();
        assert!(fold_batch(&Graph::new(&device), rows, oh * ow), "the case must be one that folds");
        fn per_sample<'g>(x: Tensor<'g>, wt: Tensor<'g>, window: Window2d, dims: [usize; 4]) -> Result<Tensor<'g>> {
            wt.matmul(x.im2col(window)?)?.reshape_to(&dims)
        }
        let xs = CheckInput::random(&[n, c, h, w], -1.0, 1.0, 1);
        let ws = CheckInput::random(&[out, rows], -1.0, 1.0, 2);
        let graph = Graph::new(&device);
        let to32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<_>>();
        let x = graph.variable(&to32(&xs.values), &xs.dims).unwrap();
        let wt = graph.variable(&to32(&ws.values), &ws.dims).unwrap();
        let r = graph.variable(&to32(&CheckInput::random(&[n, out, oh, ow], -1.0, 1.0, 3).values), &[n, out, oh, ow]);
        let r = r.unwrap();
        let mut results = Vec::new();
        for folded in [true, false] {
            let y =
                if folded { conv_folded(x, wt, window, [oh, ow]) } else { per_sample(x, wt, window, [n, out, oh, ow]) }
                    .unwrap();
            let loss = y.mul(r).unwrap().sum_all().unwrap();
            let grads = graph.grad(loss, &[x, wt], None).unwrap();
            let read = |t: Tensor<'_>| pollster::block_on(t.to_vec::<f32>()).unwrap();
            results.push([read(y), read(grads[0]), read(grads[1])]);
        }
        for (a, b) in results[0].iter().zip(&results[1]) {
            assert_eq!(a.len(), b.len());
            for (u, v) in a.iter().zip(b) {
                assert!((u - v).abs() <= 1e-5 * (1.0 + v.abs()), "{u} vs {v}");
            }
        }
        let f: BoxedFn = Box::new(move |_, t| conv_folded(t[0], t[1], window, [oh, ow]));
        let options = GradcheckOptions::default();
        let inputs = [xs, ws];
        let first = pollster::block_on(gradcheck(&device, &*f, &inputs, options)).unwrap();
        assert!(first.passed(), "{first}");
        let second = pollster::block_on(gradgradcheck(&device, &*f, &inputs, options)).unwrap();
        assert!(second.passed(), "{second}");
        // The folded adjoint on its own (its gradient is the folded Im2Col).
        let cols = CheckInput::random(&[rows, n * oh * ow], -1.0, 1.0, 4);
        let g: BoxedFn = Box::new(move |_, t| t[0].col2im_folded([h, w], window));
        let first = pollster::block_on(gradcheck(&device, &*g, std::slice::from_ref(&cols), options)).unwrap();
        assert!(first.passed(), "{first}");
        let second = pollster::block_on(gradgradcheck(&device, &*g, &[cols], options)).unwrap();
        assert!(second.passed(), "{second}");
    }

    /// Conv2d folds exactly where `fold_batch` says (W2's second layer, not
    /// its first), and never in portable numerics.
    #[test]
    fn conv2d_folds_the_batch_where_it_pays() {
        let folded_im2col = |device: &Device, c: usize, size: usize| {
            let conv = Conv2d::new(device, c, 8, [3, 3], ConvOptions::default(), 0).unwrap();
            let graph = Graph::new(device);
            let x = graph.tensor_from(&vec![0.5f32; 2 * c * size * size], &[2, c, size, size]).unwrap();
            let y = conv.forward(x).unwrap();
            (0..=y.id()).map(|id| graph.tensor(id)).any(|t| matches!(t.op(), Op::Im2Col(_)) && t.rank() == 2)
        };
        let device = Device::cpu();
        assert!(folded_im2col(&device, 32, 13));
        assert!(!folded_im2col(&device, 1, 28));
        let portable = Device::cpu_with(crate::backend::cpu::CpuNumerics::Portable);
        assert!(!folded_im2col(&portable, 32, 13));
    }
}
