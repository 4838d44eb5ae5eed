//! Sliding-window ops (NCHW): im2col/col2im and max pooling.

use std::panic::Location;

use super::same_graph;
use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::op::{Op, Window2d};
use crate::shape::{checked_product, fmt_dims};

impl Window2d {
    /// A symmetric window: kernel, stride, padding and dilation per axis
    /// (height, width). Kernel, stride and dilation must be at least 1.
    #[track_caller]
    pub fn new(kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2]) -> Result<Window2d> {
        for (name, v) in [("kernel", kernel), ("stride", stride), ("dilation", dilation)] {
            // One check and one message: each format adds to the browser download.
            if v.iter().any(|&x| x == 0 || x > u32::MAX as usize) {
                return Err(Error::invalid("Window2d", format!("{name} {v:?} must be from 1 to 4294967295")));
            }
        }
        if padding.iter().any(|&p| p > u32::MAX as usize / 2) {
            return Err(Error::invalid("Window2d", format!("padding {padding:?} is too large")));
        }
        let u = |v: [usize; 2]| [v[0] as u32, v[1] as u32];
        Ok(Window2d {
            kernel: u(kernel),
            stride: u(stride),
            dilation: u(dilation),
            pad_begin: u(padding),
            pad_end: u(padding),
        })
    }
}

/// (N, C, H, W) of a rank-4 tensor, or a shape error naming `op`.
#[track_caller]
fn nchw(op: &'static str, t: &Tensor<'_>) -> Result<[usize; 4]> {
    let d = t.dims();
    if d.len() != 4 {
        return Err(Error::shape(op, format!("expects an NCHW tensor of rank 4, got {}", fmt_dims(&d))));
    }
    Ok([d[0], d[1], d[2], d[3]])
}

#[track_caller]
fn output_size(op: &'static str, window: &Window2d, image: [usize; 2]) -> Result<[usize; 2]> {
    match window.output_size(image) {
        Some(out) => Ok(out),
        None => Err(Error::shape(
            op,
            format!(
                "a {:?} window with dilation {:?} does not fit a {}x{} image padded by {:?}/{:?}",
                window.kernel, window.dilation, image[0], image[1], window.pad_begin, window.pad_end
            ),
        )),
    }
}

/// Col2Im's checks common to both layouts: the columns' rank, the window
/// fitting the image, the image fitting u32. (kernel elements, positions).
#[track_caller]
fn col2im_check(d: &[usize], rank: usize, image: [usize; 2], window: Window2d) -> Result<(usize, usize)> {
    let k = checked_product(
        "Col2Im",
        || format!("a {:?} window", window.kernel),
        &[window.kernel[0] as usize, window.kernel[1] as usize],
    )?;
    let [oh, ow] = output_size("Col2Im", &window, image)?;
    let positions = checked_product("Col2Im", || format!("{oh}x{ow} window positions"), &[oh, ow])?;
    if d.len() != rank {
        return Err(col2im_mismatch(d, image, window, k, positions));
    }
    if image.iter().any(|&x| x > u32::MAX as usize) {
        return Err(Error::invalid("Col2Im", "image too large"));
    }
    Ok((k, positions))
}

#[track_caller]
fn col2im_mismatch(d: &[usize], image: [usize; 2], window: Window2d, k: usize, positions: usize) -> Error {
    let expected = if d.len() == 2 { format!("[C·{k}, N·{positions}]") } else { format!("[N, C·{k}, {positions}]") };
    Error::shape(
        "Col2Im",
        format!(
            "columns {} do not fit a {}x{} image with a {:?} window (expected {expected})",
            fmt_dims(d),
            image[0],
            image[1],
            window.kernel,
        ),
    )
}

impl<'g> Tensor<'g> {
    /// Unfold [N, C, H, W] into columns [N, C·kh·kw, OH·OW] (zero padding).
    #[track_caller]
    pub fn im2col(self, window: Window2d) -> Result<Tensor<'g>> {
        let dims = self.im2col_dims(window)?;
        self.graph.record(Op::Im2Col(window), &[self.id], &dims, self.dtype(), Location::caller())
    }

    /// Unfold [N, C, H, W] into columns [C·kh·kw, N·OH·OW]: `im2col` with
    /// the batch folded into the columns (sample n's window positions are
    /// columns n·OH·OW..), so that a convolution is one matrix product for
    /// the whole batch (`nn::Conv2d`; in the browser on WebGPU only: the
    /// browser's CPU kernels multiply sample by sample).
    #[track_caller]
    pub(crate) fn im2col_folded(self, window: Window2d) -> Result<Tensor<'g>> {
        let [n, rows, positions] = self.im2col_dims(window)?;
        let columns =
            checked_product("Im2Col", || format!("{n} images x {positions} window positions"), &[n, positions])?;
        self.graph.record(Op::Im2Col(window), &[self.id], &[rows, columns], self.dtype(), Location::caller())
    }

    #[track_caller]
    fn im2col_dims(&self, window: Window2d) -> Result<[usize; 3]> {
        let [n, c, h, w] = nchw("Im2Col", self)?;
        let [oh, ow] = output_size("Im2Col", &window, [h, w])?;
        let rows = checked_product(
            "Im2Col",
            || format!("{c} channels x a {:?} window", window.kernel),
            &[c, window.kernel[0] as usize, window.kernel[1] as usize],
        )?;
        let cols = checked_product("Im2Col", || format!("{oh}x{ow} window positions"), &[oh, ow])?;
        Ok([n, rows, cols])
    }

    /// Fold columns [N, C·kh·kw, OH·OW] back into [N, C, H, W], summing
    /// overlaps (the adjoint of `im2col`). `image` is (H, W).
    #[track_caller]
    pub fn col2im(self, image: [usize; 2], window: Window2d) -> Result<Tensor<'g>> {
        let d = self.dims();
        let (k, positions) = col2im_check(&d, 3, image, window)?;
        if d[1] % k != 0 || d[2] != positions {
            return Err(col2im_mismatch(&d, image, window, k, positions));
        }
        let dims = [d[0], d[1] / k, image[0], image[1]];
        let op = Op::Col2Im { window, image: [image[0] as u32, image[1] as u32] };
        self.graph.record(op, &[self.id], &dims, self.dtype(), Location::caller())
    }

    /// The adjoint of `im2col_folded`: columns [C·kh·kw, N·OH·OW] back into
    /// [N, C, H, W], summing overlaps. `image` is (H, W).
    #[track_caller]
    pub(crate) fn col2im_folded(self, image: [usize; 2], window: Window2d) -> Result<Tensor<'g>> {
        let d = self.dims();
        let (k, positions) = col2im_check(&d, 2, image, window)?;
        if d[0] % k != 0 || positions == 0 || d[1] % positions != 0 {
            return Err(col2im_mismatch(&d, image, window, k, positions));
        }
        let dims = [d[1] / positions, d[0] / k, image[0], image[1]];
        let op = Op::Col2Im { window, image: [image[0] as u32, image[1] as u32] };
        self.graph.record(op, &[self.id], &dims, self.dtype(), Location::caller())
    }

    /// 2-D max pooling. With `ceil_mode` the output rounds up, as PyTorch's
    /// does (a last window must start inside the image or its left padding).
    /// Padding must be at most half the kernel, so every window sees a pixel.
    #[track_caller]
    pub fn max_pool2d(
        self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> Result<Tensor<'g>> {
        let [_, _, h, w] = nchw("MaxPool2d", &self)?;
        let mut window = Window2d::new(kernel, stride, padding, dilation)?;
        if (0..2).any(|a| padding[a] > kernel[a] / 2) {
            return Err(Error::invalid(
                "MaxPool2d",
                format!("padding {padding:?} must be at most half the kernel {kernel:?}"),
            ));
        }
        if ceil_mode {
            let floor = output_size("MaxPool2d", &window, [h, w])?;
            // In u64: Window2d::new bounds kernel, stride and dilation by
            // u32::MAX and padding by half that; images are below 2^40.
            let image = [h as u64, w as u64];
            for a in 0..2 {
                let (kernel, stride, padding, dilation) =
                    (kernel[a] as u64, stride[a] as u64, padding[a] as u64, dilation[a] as u64);
                let span = dilation * (kernel - 1) + 1;
                let padded = image[a] + 2 * padding;
                let mut out = (padded - span).div_ceil(stride) + 1;
                if (out - 1) * stride >= image[a] + padding {
                    out -= 1;
                }
                if out > floor[a] as u64 {
                    // Extra padding after the image makes the floor formula
                    // produce the ceil-mode size; it never wins the max.
                    let pad_end = (out - 1) * stride + span - image[a] - padding;
                    window.pad_end[a] = u32::try_from(pad_end).map_err(|_| {
                        Error::invalid("MaxPool2d", format!("ceil mode needs padding {pad_end}, too large"))
                    })?;
                }
            }
        }
        self.max_pool2d_window(window)
    }

    /// Max pooling with an explicit window (asymmetric padding allowed).
    #[track_caller]
    pub fn max_pool2d_window(self, window: Window2d) -> Result<Tensor<'g>> {
        let [n, c, h, w] = nchw("MaxPool2d", &self)?;
        if !self.dtype().is_float() {
            return Err(Error::dtype("MaxPool2d", format!("needs a float tensor, got {}", self.dtype())));
        }
        let [oh, ow] = output_size("MaxPool2d", &window, [h, w])?;
        let dims = [n, c, oh, ow];
        self.graph.record(Op::MaxPool2d(window), &[self.id], &dims, self.dtype(), Location::caller())
    }

    /// The adjoint of max pooling: `self` is the pooled input x, `grad` has
    /// the pooled shape; the result has x's shape, with each window's
    /// gradient at that window's first maximum.
    #[track_caller]
    pub fn max_pool2d_backward(self, grad: Tensor<'g>, window: Window2d) -> Result<Tensor<'g>> {
        same_graph("MaxPool2dBackward", &self, &grad)?;
        let [n, c, h, w] = nchw("MaxPool2dBackward", &self)?;
        let [oh, ow] = output_size("MaxPool2dBackward", &window, [h, w])?;
        if grad.dims().as_slice() != [n, c, oh, ow] || grad.dtype() != self.dtype() || !self.dtype().is_float() {
            return Err(Error::shape(
                "MaxPool2dBackward",
                format!(
                    "gradient {} {} does not match the pooled shape {} {}",
                    fmt_dims(&grad.dims()),
                    grad.dtype(),
                    fmt_dims(&[n, c, oh, ow]),
                    self.dtype()
                ),
            ));
        }
        let dims = [n, c, h, w];
        self.graph.record(Op::MaxPool2dBackward(window), &[self.id, grad.id], &dims, self.dtype(), Location::caller())
    }
}
