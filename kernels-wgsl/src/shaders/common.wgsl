// common.wgsl — the declarations every kernel file shares; the host puts it
// in front of each file (WGSL has no imports), and it validates on its own.
//
// Parameters: binding 0 of group 0 is always the dispatch's parameter
// struct, declared by each kernel file (`params`) and mirrored field for
// field by a `#[repr(C)]` struct of the same name in kernels-wgsl's
// `params.rs` (a test compares the two layouts through naga). The host
// appends it to the execution's parameter arena and binds it at this
// dispatch's own offset, so no two dispatches of one command encoder share
// (or overwrite) parameters.
//
// Launch: one-dimensional launches of WG-thread workgroups are folded into
// a 2-D grid (x <= the adapter's per-dimension limit, usually 65,535; y as
// needed). Every entry point takes the same inputs, a `Workgroup` and the
// thread's `local_invocation_index`; `flat_id` turns them back into one
// linear index, and kernels return early for indices past their count.

// Threads per workgroup of every kernel (`shaders::WG` on the host).
const WG: u32 = 256u;
// Highest rank of the strided kernels after the host has collapsed
// contiguous and unit axes (`shaders::MAX_DIMS`).
const MAX_DIMS: u32 = 8u;

// The entry-point inputs shared by a whole workgroup. Kept apart from the
// thread's own index: WGSL's uniformity analysis treats a struct holding
// any per-thread value as per-thread, and the kernels that synchronise
// (workgroupBarrier) branch on the workgroup's number before they do.
struct Workgroup {
    @builtin(workgroup_id) id: vec3<u32>,
    @builtin(num_workgroups) count: vec3<u32>,
}

// The workgroup's linear number in the folded grid.
fn flat_group(wg: Workgroup) -> u32 {
    return wg.id.y * wg.count.x + wg.id.x;
}

// The thread's linear index in the folded grid (lid: its
// local_invocation_index).
fn flat_id(wg: Workgroup, lid: u32) -> u32 {
    return flat_group(wg) * WG + lid;
}

// The parameters of kernels that need nothing but their element count.
struct Count {
    n: u32,
}

// By bits, so that no compiler may assume NaNs away.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// The window geometry of window.wgsl and pool.wgsl: n output elements; per
// axis a (0 rows, 1 columns) the image size, the number of window
// positions, the kernel size, stride, dilation and the padding before the
// image (padding after it only shows through `positions`).
struct Window {
    n: u32,
    image: array<u32, 2>,
    positions: array<u32, 2>,
    kernel: array<u32, 2>,
    stride: array<u32, 2>,
    dilation: array<u32, 2>,
    pad: array<u32, 2>,
}

// "No such pixel / position" (the host keeps real ones below it).
const NONE: u32 = 0xffffffffu;

// One axis of a `Window` (rows or columns) as plain values. The window
// kernels index `Window`'s arrays with constants only, through `rows` and
// `cols`, so that specialised parameters fold to constants without relying
// on the driver to inline a function taking the axis number (see
// strided.wgsl's `offsets`).
struct Axis {
    image: u32,
    positions: u32,
    kernel: u32,
    stride: u32,
    dilation: u32,
    pad: u32,
}

fn rows(g: Window) -> Axis {
    return Axis(g.image[0], g.positions[0], g.kernel[0], g.stride[0], g.dilation[0], g.pad[0]);
}

fn cols(g: Window) -> Axis {
    return Axis(g.image[1], g.positions[1], g.kernel[1], g.stride[1], g.dilation[1], g.pad[1]);
}

// The image coordinate along axis `ax` of kernel tap k of window position
// o, or NONE when it falls in the padding.
fn window_pixel(ax: Axis, o: u32, k: u32) -> u32 {
    let padded = o * ax.stride + k * ax.dilation;
    if (padded < ax.pad || padded - ax.pad >= ax.image) {
        return NONE;
    }
    return padded - ax.pad;
}

// The window position along axis `ax` whose kernel tap k lands on padded
// coordinate `padded`, or NONE when no window position does.
fn window_position(ax: Axis, padded: u32, k: u32) -> u32 {
    let d = k * ax.dilation;
    if (d > padded || (padded - d) % ax.stride != 0u) {
        return NONE;
    }
    let o = (padded - d) / ax.stride;
    if (o >= ax.positions) {
        return NONE;
    }
    return o;
}

// Conversions with the CPU backend's `Cast` semantics (Rust `as`): float to
// i32 truncates and saturates, NaN gives 0; anything to bool is `!= 0`.
fn f32_to_i32(x: f32) -> i32 {
    if (is_nan(x)) {
        return 0;
    }
    if (x >= 2147483648.0) {
        return 2147483647;
    }
    if (x <= -2147483648.0) {
        return -2147483647 - 1;
    }
    return i32(x);
}

// By bits: GPUs that flush subnormals to zero would otherwise call 1e-40
// false (seen on NVIDIA's Vulkan driver), and NaN must be true.
fn f32_to_bool(x: f32) -> u32 {
    return select(0u, 1u, (bitcast<u32>(x) & 0x7fffffffu) != 0u);
}

fn i32_to_bool(x: i32) -> u32 {
    return select(0u, 1u, x != 0);
}

// ln(1 + f) + k·ln 2 for f in [sqrt(2)/2 - 1, sqrt(2) - 1] (musl's logf
// kernel, < 1 ulp): ln_f32's core, and log1p's for small arguments.
fn ln_kernel(f: f32, dk: f32) -> f32 {
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (0.40000972151756287 + w * 0.24279078841209412);
    let t2 = z * (0.66666662693023682 + w * 0.28498786687850952);
    let r = t2 + t1;
    let hfsq = 0.5 * f * f;
    // ln 2 split in a head with few bits (dk · head is exact) and a tail.
    return s * (hfsq + r) + dk * 9.0580006144591607e-6 - hfsq + f + dk * 0.69313812255859375;
}

// Natural logarithm of a positive normal f32 (musl's logf, < 1 ulp). The
// builtin `log` is not enough where it matters: Vulkan allows 2^-21
// absolute error near 1.
fn ln_f32(v: f32) -> f32 {
    var ix = bitcast<u32>(v);
    // Reduce to x in [sqrt(2)/2, sqrt(2)) times 2^k.
    ix += 0x3f800000u - 0x3f3504f3u;
    let k = i32(ix >> 23u) - 0x7f;
    ix = (ix & 0x007fffffu) + 0x3f3504f3u;
    return ln_kernel(bitcast<f32>(ix) - 1.0, f32(k));
}
