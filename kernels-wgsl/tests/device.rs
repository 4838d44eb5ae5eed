//! Backend-level tests on a real adapter (lavapipe on CI): buffers, copies,
//! reads as snapshots, limits, the 2-D dispatch grid, errors as values.
//!
//! With `CI` set, a missing Vulkan adapter fails the test; otherwise the
//! tests print a note and pass vacuously.

use kiln_core::backend::{Backend, KernelCall, TensorRef};
use kiln_core::op::{Op, UnaryOp};
use kiln_core::{DType, ErrorKind, HostData};
use kiln_wgsl::{WgpuBackend, WgpuOptions};

fn vulkan(options: WgpuOptions) -> Option<WgpuBackend> {
    let options = WgpuOptions { backends: kiln_wgsl::wgpu::Backends::VULKAN, ..options };
    match pollster::block_on(WgpuBackend::new(options)) {
        Ok(be) => {
            assert_eq!(be.adapter_info().backend, kiln_wgsl::wgpu::Backend::Vulkan);
            Some(be)
        }
        Err(e) if std::env::var("CI").is_err() => {
            eprintln!("note: no Vulkan adapter ({e}); skipping the wgpu device test");
            None
        }
        Err(e) => panic!("CI is set but no Vulkan adapter was found: {e}"),
    }
}

fn read(be: &WgpuBackend, id: kiln_core::BufferId, dtype: DType, n: usize) -> HostData {
    pollster::block_on(be.read(id, dtype, n)).unwrap()
}

#[test]
fn upload_read_copy_and_snapshots() {
    let Some(be) = vulkan(WgpuOptions::default()) else { return };
    let a = be.alloc(DType::Bool, 64).unwrap();
    be.upload(a, &HostData::Bool(vec![true, false, true])).unwrap();
    assert_eq!(read(&be, a, DType::Bool, 3), HostData::Bool(vec![true, false, true]));
    let x = be.alloc(DType::I32, 10).unwrap();
    let y = be.alloc(DType::I32, 10).unwrap();
    be.upload(x, &HostData::I32(vec![1, -2, 3])).unwrap();
    be.upload(y, &HostData::I32(vec![0; 10])).unwrap();
    be.copy(x, y, DType::I32, 2).unwrap();
    assert_eq!(read(&be, y, DType::I32, 3), HostData::I32(vec![1, -2, 0]));
    // A read is a snapshot: a later upload does not change it.
    let pending = be.read(x, DType::I32, 3);
    be.upload(x, &HostData::I32(vec![7, 7, 7])).unwrap();
    assert_eq!(pollster::block_on(pending).unwrap(), HostData::I32(vec![1, -2, 3]));
    // Unknown buffers and dtype mismatches are errors, not panics.
    be.free(y);
    assert!(pollster::block_on(be.read(y, DType::I32, 1)).is_err());
    assert!(be.upload(a, &HostData::F32(vec![1.0])).is_err());
}

#[test]
fn f64_is_refused_with_a_pointer_to_the_cpu() {
    let Some(be) = vulkan(WgpuOptions::default()) else { return };
    let e = be.alloc(DType::F64, 4).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.message().contains("f64") && e.message().contains("CPU"), "{e}");
    assert!(!be.supports(&Op::Unary(UnaryOp::Exp), DType::F64));
    assert!(be.supports(&Op::Unary(UnaryOp::Exp), DType::F32));
    assert!(!be.supports(&Op::Unary(UnaryOp::Exp), DType::I32));
    assert!(be.name().starts_with("wgpu ("), "{}", be.name());
}

fn neg(be: &WgpuBackend, n: usize) -> kiln_core::Result<Vec<f32>> {
    let x = be.alloc(DType::F32, n)?;
    let y = be.alloc(DType::F32, n)?;
    let data: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    be.upload(x, &HostData::F32(data))?;
    let dims = [n];
    let call = KernelCall {
        op: Op::Unary(UnaryOp::Neg),
        inputs: &[TensorRef { buffer: x, dims: &dims, dtype: DType::F32 }],
        output: TensorRef { buffer: y, dims: &dims, dtype: DType::F32 },
    };
    be.run(&call)?;
    be.flush()?;
    let HostData::F32(v) = pollster::block_on(be.read(y, DType::F32, n))? else { unreachable!() };
    be.free(x);
    be.free(y);
    Ok(v)
}

#[test]
fn more_than_65535_workgroups() {
    let Some(be) = vulkan(WgpuOptions::default()) else { return };
    // One workgroup past what a single dimension can hold.
    let max = be.limits().max_compute_workgroups_per_dimension as usize;
    let n = max * 256 + 1;
    let v = neg(&be, n).unwrap();
    assert_eq!(v.len(), n);
    for i in [0, 1, 999, n / 2, max * 256 - 1, max * 256] {
        assert_eq!(v[i], -((i % 1000) as f32), "element {i}");
    }
    assert!(v.iter().enumerate().all(|(i, &x)| x == -((i % 1000) as f32)));
}

#[test]
fn lowered_limits_refuse_large_tensors_clearly() {
    let options = WgpuOptions {
        max_storage_buffer_binding_size: Some(1 << 20),
        max_buffer_size: Some(4 << 20),
        ..WgpuOptions::default()
    };
    let Some(be) = vulkan(options) else { return };
    assert_eq!(be.limits().max_storage_buffer_binding_size, 1 << 20);
    // Fits the binding: runs.
    assert_eq!(neg(&be, 1 << 18).unwrap()[3], -3.0);
    // Allocates (under max_buffer_size) but cannot be bound: refused at run.
    let e = neg(&be, (1 << 18) + 1).unwrap_err();
    assert_eq!((e.kind(), e.op()), (ErrorKind::Unsupported, "Neg"), "{e}");
    assert!(e.message().contains("max_storage_buffer_binding_size"), "{e}");
    // Larger than max_buffer_size: refused at alloc.
    let e = be.alloc(DType::F32, (4 << 18) + 1).unwrap_err();
    assert_eq!((e.kind(), e.op()), (ErrorKind::Unsupported, "alloc"), "{e}");
    assert!(e.message().contains("max_buffer_size"), "{e}");
    // The backend still works afterwards.
    assert_eq!(neg(&be, 10).unwrap()[9], -9.0);
}

#[test]
fn adapters_are_listed() {
    if vulkan(WgpuOptions::default()).is_none() {
        return;
    }
    let list = kiln_wgsl::list_adapters();
    assert!(list.iter().any(|a| a.backend == "Vulkan" && a.max_storage_buffer_binding_size > 0), "{list:?}");
}
