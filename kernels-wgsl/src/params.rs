//! The host side of every kernel's parameter struct: each type here mirrors,
//! field for field, the WGSL `struct` of the same name that a kernel file (or
//! common.wgsl) binds at group 0, binding 0. The launchers fill these and
//! pass their words to `WgpuBackend::launch`; a test compares every layout
//! (size, field names and offsets) with naga's reading of the WGSL.
//!
//! All fields are 4-byte scalars or arrays of them, so `#[repr(C)]` and
//! WGSL's storage layout agree without padding.

use bytemuck::{Pod, Zeroable};

use crate::shaders::MAX_DIMS;

/// The words of a parameter struct, as the launcher takes them.
pub(crate) fn words<P: Pod>(params: &P) -> &[u32] {
    bytemuck::cast_slice(std::slice::from_ref(params))
}

/// common.wgsl: kernels that need only their element count (unary, cast).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Count {
    pub n: u32,
}

/// fill.wgsl: Full (`arange` 0, `value` the bits of the output element) or
/// Arange (`arange` 1; exactly in i32 when `exact` is 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Fill {
    pub n: u32,
    pub arange: u32,
    pub value: u32,
    pub start: f32,
    pub step: f32,
    pub exact: u32,
    pub start_i: i32,
    pub step_i: i32,
}

/// common.wgsl: one operand of a strided iteration.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Operand {
    pub base: u32,
    pub strides: [u32; MAX_DIMS],
}

/// common.wgsl: the strided geometry of binary.wgsl, where.wgsl and
/// movement.wgsl (filled by `geometry::strided`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Strided {
    pub n: u32,
    pub rank: u32,
    pub dims: [u32; MAX_DIMS],
    pub operands: [Operand; 4],
}

/// reduce.wgsl: one collapsed group of axes and their input strides.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Axes {
    pub rank: u32,
    pub dims: [u32; MAX_DIMS],
    pub strides: [u32; MAX_DIMS],
}

/// reduce.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Reduce {
    pub outputs: u32,
    pub kept: Axes,
    pub reduced: Axes,
    pub block: u32,
    pub groups: u32,
    pub parts: u32,
}

/// matmul.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MatMul {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub a_row: u32,
    pub a_col: u32,
    pub b_row: u32,
    pub b_col: u32,
    pub batch_rank: u32,
    pub batch_dims: [u32; MAX_DIMS],
    pub a_batch: [u32; MAX_DIMS],
    pub b_batch: [u32; MAX_DIMS],
    pub first_batch: u32,
    pub chunk: u32,
    pub first_chunk: u32,
    pub chunks: u32,
    pub chunk_stride: u32,
}

/// chunks.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Chunks {
    pub outputs: u32,
    pub products: u32,
}

/// index.wgsl (each entry point reads the fields its comment names).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Index {
    pub n: u32,
    pub size: u32,
    pub count: u32,
    pub inner: u32,
    pub slot: u32,
    /// `sort_step`: the partner distance and the merged sequence length.
    pub j: u32,
    pub k: u32,
}

/// update.wgsl (SGD reads the first six fields, Adam all but the SGD ones).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Update {
    pub n: u32,
    pub flags: u32,
    pub lr: f32,
    pub weight_decay: f32,
    pub momentum: f32,
    pub one_minus_dampening: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub one_minus_beta1: f32,
    pub one_minus_beta2: f32,
    pub step_size: f32,
    pub rsqrt_bias2: f32,
    pub eps: f32,
    pub decay_factor: f32,
}

/// common.wgsl: the window geometry of window.wgsl and pool.wgsl, per axis
/// (rows, columns).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Window {
    pub n: u32,
    pub image: [u32; 2],
    pub positions: [u32; 2],
    pub kernel: [u32; 2],
    pub stride: [u32; 2],
    pub dilation: [u32; 2],
    pub pad: [u32; 2],
}

/// window_folded.wgsl: the geometry and the batch folded into the columns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Folded {
    pub window: Window,
    pub batch: u32,
}

/// pool.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Pool {
    pub window: Window,
}

/// random.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Random {
    pub n: u32,
    pub keys: [u32; 2],
}

/// scan.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Scan {
    pub lines: u32,
    pub len: u32,
    pub inner: u32,
    /// Bit 0: exclusive; bit 1: reverse.
    pub flags: u32,
    /// The segment of each line this dispatch adds (kernels/scan.rs).
    pub start: u32,
    pub count: u32,
}

/// select.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Select {
    pub rows: u32,
    pub len: u32,
    pub k: u32,
    pub largest: u32,
    /// The position chosen and the segment of the rows scanned by this
    /// dispatch (kernels/select.rs).
    pub p: u32,
    pub start: u32,
    pub count: u32,
}

/// rowwise.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Rowwise {
    pub rows: u32,
    pub l: u32,
    pub s: u32,
    pub diagonal: i32,
    pub groups: u32,
    pub parts: u32,
}

/// norm.wgsl (native only, as its kernel).
#[cfg(not(target_arch = "wasm32"))]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Norm {
    pub rows: u32,
    pub n: u32,
    pub eps: f32,
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;
    use crate::shaders::{as_written, FILES};

    /// A host struct's name, size and (field, offset) list.
    struct Layout {
        name: &'static str,
        size: usize,
        fields: Vec<(&'static str, usize)>,
    }

    macro_rules! layout {
        ($t:ident { $($f:ident),* $(,)? }) => {
            Layout { name: stringify!($t), size: size_of::<$t>(), fields: vec![$((stringify!($f), offset_of!($t, $f))),*] }
        };
    }

    fn host_layouts() -> Vec<Layout> {
        vec![
            layout!(Count { n }),
            layout!(Fill { n, arange, value, start, step, exact, start_i, step_i }),
            layout!(Operand { base, strides }),
            layout!(Strided { n, rank, dims, operands }),
            layout!(Axes { rank, dims, strides }),
            layout!(Reduce { outputs, kept, reduced, block, groups, parts }),
            layout!(MatMul {
                m,
                n,
                k,
                a_row,
                a_col,
                b_row,
                b_col,
                batch_rank,
                batch_dims,
                a_batch,
                b_batch,
                first_batch,
                chunk,
                first_chunk,
                chunks,
                chunk_stride
            }),
            layout!(Chunks { outputs, products }),
            layout!(Index { n, size, count, inner, slot, j, k }),
            layout!(Update {
                n,
                flags,
                lr,
                weight_decay,
                momentum,
                one_minus_dampening,
                beta1,
                beta2,
                one_minus_beta1,
                one_minus_beta2,
                step_size,
                rsqrt_bias2,
                eps,
                decay_factor
            }),
            layout!(Window { n, image, positions, kernel, stride, dilation, pad }),
            layout!(Pool { window }),
            layout!(Folded { window, batch }),
            layout!(Random { n, keys }),
            layout!(Rowwise { rows, l, s, diagonal, groups, parts }),
            layout!(Scan { lines, len, inner, flags, start, count }),
            layout!(Select { rows, len, k, largest, p, start, count }),
            layout!(Norm { rows, n, eps }),
        ]
    }

    /// Every WGSL struct declared in the shader files, by name: (span,
    /// members with offsets), as naga lays them out.
    fn wgsl_structs() -> Vec<(String, u32, Vec<(String, u32)>)> {
        let mut found = Vec::new();
        for (name, text) in FILES {
            let src = as_written(name, text);
            let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
            for (_, ty) in module.types.iter() {
                if let (Some(n), naga::TypeInner::Struct { members, span }) = (&ty.name, &ty.inner) {
                    let members = members.iter().map(|m| (m.name.clone().unwrap_or_default(), m.offset)).collect();
                    let entry = (n.clone(), *span, members);
                    if !found.contains(&entry) {
                        found.push(entry);
                    }
                }
            }
        }
        found
    }

    #[test]
    fn host_structs_match_the_wgsl_structs() {
        let wgsl = wgsl_structs();
        for host in host_layouts() {
            let matches: Vec<_> = wgsl.iter().filter(|(n, ..)| n == host.name).collect();
            assert_eq!(
                matches.len(),
                1,
                "struct {} is declared {} times (differently) in the WGSL",
                host.name,
                matches.len()
            );
            let (_, span, members) = matches[0];
            assert_eq!(*span as usize, host.size, "struct {}: WGSL size {span}, host size {}", host.name, host.size);
            let wgsl_fields: Vec<(&str, usize)> = members.iter().map(|(n, o)| (n.as_str(), *o as usize)).collect();
            assert_eq!(
                wgsl_fields, host.fields,
                "struct {}: fields and offsets differ (left WGSL, right host)",
                host.name
            );
        }
    }

    /// Every parameter struct the kernels bind has a host mirror checked
    /// above (so a new kernel cannot skip the check).
    #[test]
    fn every_bound_parameter_struct_has_a_host_mirror() {
        let hosts: Vec<&str> = host_layouts().iter().map(|l| l.name).collect();
        for (name, text) in FILES.iter().skip(1) {
            let src = as_written(name, text);
            let module = naga::front::wgsl::parse_str(&src).unwrap();
            for (_, var) in module.global_variables.iter() {
                if var.binding.as_ref().is_some_and(|b| b.group == 0 && b.binding == 0) {
                    let ty = module.types[var.ty].name.clone().unwrap_or_default();
                    assert!(hosts.contains(&ty.as_str()), "{name} binds parameters of type `{ty}` with no host struct");
                }
            }
        }
    }

    #[test]
    fn words_are_the_fields_in_order() {
        let p = Rowwise { rows: 3, l: 4, s: 5, diagonal: -1, groups: 6, parts: 7 };
        assert_eq!(words(&p), &[3, 4, 5, u32::MAX, 6, 7]);
        // A test that can fail: the layout check notices a reordered struct.
        let reordered = Layout {
            name: "Rowwise",
            size: 24,
            fields: vec![("l", 0), ("rows", 4), ("s", 8), ("diagonal", 12), ("groups", 16), ("parts", 20)],
        };
        let wgsl = wgsl_structs();
        let (_, _, members) = wgsl.iter().find(|(n, ..)| n == reordered.name).unwrap();
        let wgsl_fields: Vec<(&str, usize)> = members.iter().map(|(n, o)| (n.as_str(), *o as usize)).collect();
        assert_ne!(wgsl_fields, reordered.fields);
    }
}
