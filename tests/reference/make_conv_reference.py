#!/usr/bin/env python3
"""Reference values for kiln's convolution and pooling layers.

An implementation independent of kiln's: every output element is computed by
nested loops over output positions straight from the definitions (PyTorch's
conventions, NCHW), never through im2col or a matrix product. Writes
conv_reference.json next to this script; tests/tests/conv_reference.rs loads
it and compares kiln's outputs within 1e-5.

    python3 tests/reference/make_conv_reference.py

Inputs and weights are seeded and rounded to f32 (kiln runs the layers in
f32), outputs are computed in f64. Requires numpy (only for the seeded
generator and array storage).
"""

import json
import math
import os

import numpy as np

# ----- direct definitions ---------------------------------------------------


def conv2d(x, w, b, stride, padding, dilation, groups):
    """out[n, o, oy, ox] = b[o] + sum over the group's input channels c and
    kernel taps (i, j) of x[n, c, oy*s - p + i*d, ox*s - p + j*d] * w[o, c', i, j]
    (zero padding)."""
    n_, c_, h, w_ = x.shape
    o_, cg, kh, kw = w.shape
    assert c_ == cg * groups and o_ % groups == 0
    og = o_ // groups
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w_ + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n_, o_, oh, ow))
    for n in range(n_):
        for o in range(o_):
            g = o // og
            for oy in range(oh):
                for ox in range(ow):
                    acc = 0.0 if b is None else float(b[o])
                    for c in range(cg):
                        for i in range(kh):
                            y = oy * sh - ph + i * dh
                            if y < 0 or y >= h:
                                continue
                            for j in range(kw):
                                xx = ox * sw - pw + j * dw
                                if xx < 0 or xx >= w_:
                                    continue
                                acc += float(x[n, g * cg + c, y, xx]) * float(w[o, c, i, j])
                    out[n, o, oy, ox] = acc
    return out


def conv_transpose2d(x, w, b, stride, padding, dilation, output_padding):
    """The transposed convolution, by output position: out[n, o, y, x] sums
    x[n, c, iy, ix] * w[c, o, i, j] over every (iy, i) with
    iy*s - p + i*d == y (likewise for columns)."""
    n_, c_, h, w_ = x.shape
    c2, o_, kh, kw = w.shape
    assert c_ == c2
    (sh, sw), (ph, pw), (dh, dw), (oph, opw) = stride, padding, dilation, output_padding
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (w_ - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    out = np.zeros((n_, o_, oh, ow))
    for n in range(n_):
        for o in range(o_):
            for y in range(oh):
                for xx in range(ow):
                    acc = 0.0 if b is None else float(b[o])
                    for i in range(kh):
                        t = y + ph - i * dh
                        if t < 0 or t % sh != 0 or t // sh >= h:
                            continue
                        iy = t // sh
                        for j in range(kw):
                            u = xx + pw - j * dw
                            if u < 0 or u % sw != 0 or u // sw >= w_:
                                continue
                            ix = u // sw
                            for c in range(c_):
                                acc += float(x[n, c, iy, ix]) * float(w[c, o, i, j])
                    out[n, o, y, xx] = acc
    return out


def pool_output_size(size, k, s, p, d, ceil_mode):
    """PyTorch's pooling_output_shape: floor or ceil, and in ceil mode a last
    window that would start in the right padding is dropped."""
    span = d * (k - 1) + 1
    num = size + 2 * p - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def max_pool2d(x, kernel, stride, padding, dilation, ceil_mode):
    """-inf padding: the maximum over the window's in-image taps."""
    n_, c_, h, w_ = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    oh = pool_output_size(h, kh, sh, ph, dh, ceil_mode)
    ow = pool_output_size(w_, kw, sw, pw, dw, ceil_mode)
    out = np.zeros((n_, c_, oh, ow))
    for n in range(n_):
        for c in range(c_):
            for oy in range(oh):
                for ox in range(ow):
                    best = -math.inf
                    for i in range(kh):
                        y = oy * sh - ph + i * dh
                        if y < 0 or y >= h:
                            continue
                        for j in range(kw):
                            xx = ox * sw - pw + j * dw
                            if 0 <= xx < w_:
                                best = max(best, float(x[n, c, y, xx]))
                    assert best > -math.inf, "a window saw no pixel"
                    out[n, c, oy, ox] = best
    return out


def avg_pool2d(x, kernel, stride, padding):
    """count_include_pad = True (PyTorch's default), floor mode: the sum of
    the in-image taps divided by kh*kw."""
    n_, c_, h, w_ = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh = pool_output_size(h, kh, sh, ph, 1, False)
    ow = pool_output_size(w_, kw, sw, pw, 1, False)
    out = np.zeros((n_, c_, oh, ow))
    for n in range(n_):
        for c in range(c_):
            for oy in range(oh):
                for ox in range(ow):
                    acc = 0.0
                    for i in range(kh):
                        y = oy * sh - ph + i
                        for j in range(kw):
                            xx = ox * sw - pw + j
                            if 0 <= y < h and 0 <= xx < w_:
                                acc += float(x[n, c, y, xx])
                    out[n, c, oy, ox] = acc / (kh * kw)
    return out


def adaptive_avg_pool2d(x, output):
    """Window i covers [floor(i*H/out), ceil((i+1)*H/out))."""
    n_, c_, h, w_ = x.shape
    oh, ow = output
    out = np.zeros((n_, c_, oh, ow))
    for n in range(n_):
        for c in range(c_):
            for oy in range(oh):
                y0, y1 = (oy * h) // oh, -(-((oy + 1) * h) // oh)
                for ox in range(ow):
                    x0, x1 = (ox * w_) // ow, -(-((ox + 1) * w_) // ow)
                    acc = 0.0
                    for y in range(y0, y1):
                        for xx in range(x0, x1):
                            acc += float(x[n, c, y, xx])
                    out[n, c, oy, ox] = acc / ((y1 - y0) * (x1 - x0))
    return out


# ----- self-checks of the definitions on hand-computed values ---------------


def self_check():
    x = np.arange(16, dtype=np.float64).reshape(1, 1, 4, 4)
    # A 1x1 identity kernel reproduces the input; a 3x3 one-hot centre tap
    # with padding 1 too.
    assert np.array_equal(conv2d(x, np.ones((1, 1, 1, 1)), None, (1, 1), (0, 0), (1, 1), 1), x)
    centre = np.zeros((1, 1, 3, 3))
    centre[0, 0, 1, 1] = 1.0
    assert np.array_equal(conv2d(x, centre, None, (1, 1), (1, 1), (1, 1), 1), x)
    # 2x2 sums with stride 2.
    s = conv2d(x, np.ones((1, 1, 2, 2)), None, (2, 2), (0, 0), (1, 1), 1)
    assert s.ravel().tolist() == [10.0, 18.0, 42.0, 50.0]
    # Max pooling 2x2 stride 2; average pooling with padding counts zeros.
    assert max_pool2d(x, (2, 2), (2, 2), (0, 0), (1, 1), False).ravel().tolist() == [5.0, 7.0, 13.0, 15.0]
    a = avg_pool2d(x, (2, 2), (2, 2), (1, 1))
    assert a[0, 0, 0, 0] == 0.0 / 4 and a[0, 0, 0, 1] == (1 + 2) / 4
    # Ceil mode: 5 wide, kernel 2, stride 2, padding 1: the 4th window would
    # start in the right padding and is dropped (3 windows, as in floor mode).
    assert pool_output_size(5, 2, 2, 1, 1, True) == 3
    assert pool_output_size(6, 3, 2, 1, 1, True) == 4 and pool_output_size(6, 3, 2, 1, 1, False) == 3
    # Transposed convolution is the adjoint of convolution.
    rng = np.random.default_rng(0)
    xi = rng.standard_normal((1, 2, 5, 6))
    wi = rng.standard_normal((3, 2, 2, 3))
    args = ((2, 1), (1, 0), (1, 2))
    yc = conv2d(xi, wi, None, *args, 1)
    yi = rng.standard_normal(yc.shape)
    xt = conv_transpose2d(yi, wi, None, *args, (1, 0))
    assert xt.shape == xi.shape, (xt.shape, xi.shape)
    assert abs((yc * yi).sum() - (xi * xt).sum()) < 1e-9
    # Adaptive pooling windows of 5 -> 3: [0,2), [1,4), [3,5).
    r = np.arange(5, dtype=np.float64).reshape(1, 1, 1, 5)
    assert adaptive_avg_pool2d(r, (1, 3)).ravel().tolist() == [0.5, 2.0, 3.5]


# ----- cases -----------------------------------------------------------------


def f32(rng, shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, size=shape).astype(np.float32).astype(np.float64)


def tensor(a):
    return {"dims": list(a.shape), "values": [float(v) for v in a.ravel()]}


def main():
    self_check()
    rng = np.random.default_rng(20240917)
    doc = {
        "generator": "tests/reference/make_conv_reference.py (direct nested loops, numpy "
        + np.__version__
        + ")",
        "conv2d": [],
        "conv_transpose2d": [],
        "max_pool2d": [],
        "avg_pool2d": [],
        "adaptive_avg_pool2d": [],
    }

    # name, (N, C, H, W), out channels, kernel, stride, padding, dilation, groups, bias
    conv_cases = [
        ("plain 3x3", (2, 3, 5, 5), 4, (3, 3), (1, 1), (0, 0), (1, 1), 1, True),
        ("per-axis k[2,3] s[2,1] p[1,0] d[1,2]", (2, 2, 6, 7), 3, (2, 3), (2, 1), (1, 0), (1, 2), 1, True),
        ("groups 2, k[3,2] s[1,2] p[1,1] d[2,1]", (1, 4, 6, 5), 6, (3, 2), (1, 2), (1, 1), (2, 1), 2, True),
        ("depthwise groups 3, stride 2, padding 1, no bias", (2, 3, 5, 6), 3, (3, 3), (2, 2), (1, 1), (1, 1), 3, False),
        ("stride [3,2] padding [2,1]", (1, 2, 7, 6), 2, (3, 3), (3, 2), (2, 1), (1, 1), 1, True),
        ("groups 2, dilation 2, padding 2", (1, 2, 6, 6), 4, (3, 3), (1, 1), (2, 2), (2, 2), 2, True),
    ]
    for name, (n, c, h, w), o, k, s, p, d, g, bias in conv_cases:
        x = f32(rng, (n, c, h, w))
        wt = f32(rng, (o, c // g, k[0], k[1]))
        b = f32(rng, (o,)) if bias else None
        y = conv2d(x, wt, b, s, p, d, g)
        doc["conv2d"].append(
            {
                "name": name,
                "input": tensor(x),
                "weight": tensor(wt),
                "bias": None if b is None else tensor(b),
                "kernel": list(k),
                "stride": list(s),
                "padding": list(p),
                "dilation": list(d),
                "groups": g,
                "output": tensor(y),
            }
        )

    # name, (N, C, H, W), out channels, kernel, stride, padding, dilation, output_padding, bias
    convt_cases = [
        ("k3 s2 p1 output_padding 1", (1, 2, 3, 3), 3, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), True),
        ("per-axis k[2,3] s[2,1] p[1,0] d[1,2] op[1,0]", (2, 3, 3, 4), 2, (2, 3), (2, 1), (1, 0), (1, 2), (1, 0), True),
        ("k[3,2] s[1,3] p[1,0] d[2,1] op[0,2], no bias", (1, 2, 4, 3), 2, (3, 2), (1, 3), (1, 0), (2, 1), (0, 2), False),
    ]
    for name, (n, c, h, w), o, k, s, p, d, op, bias in convt_cases:
        x = f32(rng, (n, c, h, w))
        wt = f32(rng, (c, o, k[0], k[1]))
        b = f32(rng, (o,)) if bias else None
        y = conv_transpose2d(x, wt, b, s, p, d, op)
        doc["conv_transpose2d"].append(
            {
                "name": name,
                "input": tensor(x),
                "weight": tensor(wt),
                "bias": None if b is None else tensor(b),
                "kernel": list(k),
                "stride": list(s),
                "padding": list(p),
                "dilation": list(d),
                "output_padding": list(op),
                "output": tensor(y),
            }
        )

    # name, (N, C, H, W), kernel, stride, padding, dilation, ceil_mode
    max_cases = [
        ("k2 s2", (2, 2, 4, 6), (2, 2), (2, 2), (0, 0), (1, 1), False),
        ("per-axis k[3,2] s[2,1] p[1,0] d[1,2]", (1, 2, 7, 6), (3, 2), (2, 1), (1, 0), (1, 2), False),
        ("per-axis k[3,2] s[2,1] p[1,0] d[1,2] ceil", (1, 2, 7, 6), (3, 2), (2, 1), (1, 0), (1, 2), True),
        ("ceil adds a window: 6x6 k3 s2 p1", (1, 2, 6, 6), (3, 3), (2, 2), (1, 1), (1, 1), True),
        ("ceil drops a window starting in the right padding: 5x5 k2 s2 p1", (1, 2, 5, 5), (2, 2), (2, 2), (1, 1), (1, 1), True),
        ("ceil, k[2,3] s[3,2] p[1,1] d[2,1] on 7x8", (2, 1, 7, 8), (2, 3), (3, 2), (1, 1), (2, 1), True),
        ("floor, k[2,3] s[3,2] p[1,1] d[2,1] on 7x8", (2, 1, 7, 8), (2, 3), (3, 2), (1, 1), (2, 1), False),
    ]
    for name, (n, c, h, w), k, s, p, d, ceil in max_cases:
        # Distinct values (a random permutation): no ties.
        x = (rng.permutation(n * c * h * w).astype(np.float64) / 8.0 - 3.0).reshape(n, c, h, w)
        y = max_pool2d(x, k, s, p, d, ceil)
        doc["max_pool2d"].append(
            {
                "name": name,
                "input": tensor(x),
                "kernel": list(k),
                "stride": list(s),
                "padding": list(p),
                "dilation": list(d),
                "ceil_mode": ceil,
                "output": tensor(y),
            }
        )

    # name, (N, C, H, W), kernel, stride, padding
    avg_cases = [
        ("k2 s2", (1, 2, 4, 4), (2, 2), (2, 2), (0, 0)),
        ("k[3,2] s[2,1] p[1,1] count_include_pad", (2, 1, 5, 4), (3, 2), (2, 1), (1, 1)),
        ("k3 s2 p1 count_include_pad", (1, 2, 6, 5), (3, 3), (2, 2), (1, 1)),
    ]
    for name, (n, c, h, w), k, s, p in avg_cases:
        x = f32(rng, (n, c, h, w))
        doc["avg_pool2d"].append(
            {
                "name": name,
                "input": tensor(x),
                "kernel": list(k),
                "stride": list(s),
                "padding": list(p),
                "output": tensor(avg_pool2d(x, k, s, p)),
            }
        )

    # name, (N, C, H, W), output
    adaptive_cases = [
        ("5x5 to 3x3 (uneven, overlapping)", (1, 2, 5, 5), (3, 3)),
        ("7x5 to 3x2", (2, 1, 7, 5), (3, 2)),
        ("6x4 to 3x2 (even)", (1, 2, 6, 4), (3, 2)),
        ("4x5 to 4x1", (1, 1, 4, 5), (4, 1)),
    ]
    for name, (n, c, h, w), out in adaptive_cases:
        x = f32(rng, (n, c, h, w))
        doc["adaptive_avg_pool2d"].append(
            {"name": name, "input": tensor(x), "output_size": list(out), "output": tensor(adaptive_avg_pool2d(x, out))}
        )

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv_reference.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    total = sum(len(v) for k, v in doc.items() if isinstance(v, list))
    print(f"wrote {path}: {total} cases")


if __name__ == "__main__":
    main()
