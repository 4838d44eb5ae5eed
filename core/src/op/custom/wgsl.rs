//! WGSL kernels of custom ops, checked when the op is registered (so a bad
//! kernel is an error at `register`, never a failure deep inside a training
//! step): with naga when kiln-core has its `wgsl` feature (native builds,
//! where wgpu brings naga anyway), otherwise with `scan`, a naga-free reader
//! of the declarations and the entry point (the browser package: naga would
//! be ~40 % of its download, and the browser's own compiler checks the rest
//! of the kernel when it is first used, see kiln-wgsl's pipelines).
//!
//! The contract a kernel follows:
//! - group 0, binding k + 1: input k as `var<storage, read> array<T>`;
//!   binding arity + 1: the output as `var<storage, read_write> array<T>`,
//!   with T `f32`, `i32` or `u32` (bool tensors are 0/1 `u32` words); every
//!   one of them used by the entry point;
//! - the entry point `@compute @workgroup_size(256) fn main(...)`, launched
//!   with one invocation per output element (rounded up to whole
//!   workgroups, folded into a 2-D grid of workgroups);
//! - kiln appends `PRELUDE` to the source: binding 0 holds the element
//!   counts, `kiln_index(wid, nwg, lid)` gives the invocation's element and
//!   `kiln_len()` the output's count, which the kernel must check (so
//!   binding 0 must be used too).
//!
//! The prelude goes after the user's code (WGSL declarations may come in
//! any order), so the line numbers of naga, `scan` and the browser are the
//! user's own.

#[cfg(feature = "wgsl")]
use naga::valid::{Capabilities, ValidationFlags, Validator};
#[cfg(feature = "wgsl")]
use naga::{AddressSpace, ScalarKind, ShaderStage, StorageAccess, TypeInner};

use super::WgslKernel;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Threads per workgroup of every custom kernel.
pub const WORKGROUP_SIZE: u32 = 256;

/// What kiln adds to every custom kernel (see the module docs).
pub const PRELUDE: &str = "
// ---- kiln custom-op prelude ----
// kiln_params[0]: elements of the output; kiln_params[1 + k]: elements of input k.
@group(0) @binding(0) var<storage, read> kiln_params: array<u32>;

const KILN_WORKGROUP_SIZE: u32 = 256u;

fn kiln_len() -> u32 {
    return kiln_params[0];
}

fn kiln_input_len(k: u32) -> u32 {
    return kiln_params[1u + k];
}

// The element of invocation `lid` of workgroup `wid` in a grid of `nwg`.
fn kiln_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * KILN_WORKGROUP_SIZE + lid;
}
";

const OP: &str = "register_custom_op";

/// The error of a kernel that breaks the contract.
pub(crate) fn refusal(name: &str, what: String) -> Error {
    Error::invalid(OP, format!("custom op {name}: WGSL kernel: {what}"))
}

/// The entry point `main` as the contract sees it.
pub(crate) struct Entry {
    pub compute: bool,
    pub workgroup_size: [u32; 3],
}

/// A global with a `@binding`, in declaration order.
pub(crate) struct Global {
    pub name: String,
    pub group: u32,
    pub binding: u32,
    /// `Some(writable)` for a storage buffer.
    pub storage: Option<bool>,
    /// The element of an `array<f32 | i32 | u32>`, else `None`.
    pub dtype: Option<DType>,
    /// Reached from `main`.
    pub used: bool,
}

/// Parse, validate and check the interface of a custom op's kernel.
pub fn validate(name: &str, arity: usize, source: &str) -> Result<WgslKernel> {
    // WebGPU guarantees 8 storage buffers per stage; binding 0 is kiln's.
    if arity + 2 > 8 {
        return Err(refusal(name, format!("{arity} inputs need {} storage buffers; WebGPU guarantees 8", arity + 2)));
    }
    let full = format!("{source}\n{PRELUDE}");
    #[cfg(feature = "wgsl")]
    let (entry, globals) = read_with_naga(name, &full)?;
    #[cfg(not(feature = "wgsl"))]
    let (entry, globals) = super::wgsl_scan::read(&full).map_err(|what| refusal(name, what))?;
    let bindings = check_interface(arity, entry, globals).map_err(|what| refusal(name, what))?;
    Ok(WgslKernel { source: full, bindings })
}

/// The contract on the entry point and the bindings: the dtype of each
/// binding 1..=arity+1, or what is wrong.
pub(crate) fn check_interface(
    arity: usize,
    entry: Option<Entry>,
    globals: Vec<Global>,
) -> std::result::Result<Vec<DType>, String> {
    let Some(entry) = entry else {
        return Err("has no entry point `main`".to_string());
    };
    if !entry.compute {
        return Err("`main` is not a @compute entry point".to_string());
    }
    if entry.workgroup_size != [WORKGROUP_SIZE, 1, 1] {
        return Err(format!(
            "`main` has @workgroup_size{:?}; custom kernels use @workgroup_size({WORKGROUP_SIZE})",
            entry.workgroup_size
        ));
    }
    let mut bindings: Vec<Option<DType>> = vec![None; arity + 1];
    for g in globals {
        let var_name = g.name;
        if g.group != 0 {
            return Err(format!("`{var_name}` is in group {}; custom kernels use group 0 only", g.group));
        }
        if g.binding == 0 {
            if var_name != "kiln_params" {
                return Err(format!("`{var_name}` uses binding 0, which holds kiln's parameters"));
            }
            if !g.used {
                return Err("`main` never reads kiln_len(): it must check its index against it".to_string());
            }
            continue;
        }
        let slot = g.binding as usize - 1;
        if slot > arity {
            return Err(format!(
                "`{var_name}` uses binding {}, but an op of arity {arity} has bindings 1..={} (inputs, then \
                 the output)",
                g.binding,
                arity + 1
            ));
        }
        let output = slot == arity;
        let Some(writable) = g.storage else {
            return Err(format!("`{var_name}` (binding {}) is not a storage buffer", g.binding));
        };
        if output != writable {
            let want = if output { "read_write (it is the output)" } else { "read (it is an input)" };
            return Err(format!("`{var_name}` (binding {}) must be {want}", g.binding));
        }
        let Some(dtype) = g.dtype else {
            return Err(format!("`{var_name}` (binding {}) is not an array of f32, i32 or u32", g.binding));
        };
        if !g.used {
            return Err(format!("`{var_name}` (binding {}) is declared but `main` never uses it", g.binding));
        }
        bindings[slot] = Some(dtype);
    }
    bindings
        .into_iter()
        .enumerate()
        .map(|(k, b)| {
            b.ok_or_else(|| {
                let what = if k == arity { "the output".to_string() } else { format!("input {k}") };
                format!("no binding {} for {what}", k + 1)
            })
        })
        .collect()
}

/// naga's parse and validation, and what the contract needs from its module.
#[cfg(feature = "wgsl")]
fn read_with_naga(name: &str, full: &str) -> Result<(Option<Entry>, Vec<Global>)> {
    let module = naga::front::wgsl::parse_str(full)
        .map_err(|e| refusal(name, format!("does not parse:\n{}", e.emit_to_string(full))))?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module)
        .map_err(|e| refusal(name, format!("does not validate:\n{}", e.emit_to_string(full))))?;
    let Some((entry_index, entry)) = module.entry_points.iter().enumerate().find(|(_, e)| e.name == "main") else {
        return Ok((None, Vec::new()));
    };
    let uses = info.get_entry_point(entry_index);
    let globals = module
        .global_variables
        .iter()
        .filter_map(|(handle, var)| {
            let binding = var.binding.as_ref()?;
            let storage = match var.space {
                AddressSpace::Storage { access } => Some(access.contains(StorageAccess::STORE)),
                _ => None,
            };
            Some(Global {
                name: var.name.clone().unwrap_or_default(),
                group: binding.group,
                binding: binding.binding,
                storage,
                dtype: element_dtype(&module, var.ty),
                used: !uses[handle].is_empty(),
            })
        })
        .collect();
    let entry = Entry { compute: entry.stage == ShaderStage::Compute, workgroup_size: entry.workgroup_size };
    Ok((Some(entry), globals))
}

/// The tensor dtype an `array<T>` binding holds.
#[cfg(feature = "wgsl")]
fn element_dtype(module: &naga::Module, ty: naga::Handle<naga::Type>) -> Option<DType> {
    let TypeInner::Array { base, .. } = module.types[ty].inner else { return None };
    let TypeInner::Scalar(scalar) = module.types[base].inner else { return None };
    match (scalar.kind, scalar.width) {
        (ScalarKind::Float, 4) => Some(DType::F32),
        (ScalarKind::Sint, 4) => Some(DType::I32),
        (ScalarKind::Uint, 4) => Some(DType::Bool),
        _ => None,
    }
}

#[cfg(all(test, feature = "wgsl"))]
mod tests {
    use super::validate;

    use super::super::DOUBLING_KERNEL as GOOD;

    fn error(source: &str, arity: usize) -> String {
        validate("T", arity, source).unwrap_err().to_string()
    }

    #[test]
    fn a_kernel_following_the_contract_passes() {
        let k = validate("T", 1, GOOD).unwrap();
        assert_eq!(k.bindings, vec![crate::DType::F32, crate::DType::F32]);
        assert!(k.source.contains("fn kiln_index"));
    }

    #[test]
    fn bad_kernels_are_refused_with_the_reason() {
        let e = error(&GOOD.replace("2.0 * x[i]", "2.0 * x[i] +"), 1);
        assert!(e.contains("does not parse") && e.contains("wgsl:9:"), "{e}");
        let e = error(&GOOD.replace("2.0 * x[i]", "x[i] + 1u"), 1);
        assert!(e.contains("does not"), "{e}");
        assert!(error(&GOOD.replace("fn main", "fn run"), 1).contains("no entry point `main`"));
        assert!(error(&GOOD.replace("(256)", "(64)"), 1).contains("@workgroup_size"));
        assert!(error(GOOD, 2).contains("must be read (it is an input)"), "{}", error(GOOD, 2));
        // Writing a read-only output is naga's own validation error.
        assert!(error(&GOOD.replace("read_write> y", "read> y"), 1).contains("does not validate"));
        assert!(error(&GOOD.replace("read> x", "read_write> x"), 1).contains("must be read (it is an input)"));
        let vector = GOOD.replace("array<f32>;\n@group(0) @binding(2)", "array<vec2<f32>>;\n@group(0) @binding(2)");
        assert!(error(&vector.replace("2.0 * x[i]", "2.0 * x[i].x"), 1).contains("not an array of f32"));
        let unchecked = GOOD.replace("if (i >= kiln_len()) { return; }", "");
        assert!(error(&unchecked, 1).contains("kiln_len"));
        assert!(error(&GOOD.replace("2.0 * x[i]", "2.0"), 1).contains("never uses it"));
    }
}
