//! The backend's buffers: a slab of `wgpu::Buffer`s indexed by `BufferId`.
//!
//! Storage: f32 as f32, i32 as i32, bool as one u32 word (0/1) per element —
//! WGSL has no 8-bit storage, and a word per bool keeps every kernel's
//! indexing the same. f64 does not exist in WGSL: allocating it is refused.

use kiln_core::backend::BufferId;
use kiln_core::{DType, Error, HostData, Result};

use crate::context::Context;

/// Bytes per stored element (every dtype the backend stores is one word).
pub(crate) const WORD: u64 = 4;

pub(crate) struct Stored {
    pub buffer: wgpu::Buffer,
    pub dtype: DType,
    /// Capacity in elements.
    pub len: usize,
}

#[derive(Default)]
pub(crate) struct Buffers {
    slab: Vec<Option<Stored>>,
    free_ids: Vec<u32>,
}

pub(crate) fn f64_refused(op: &'static str) -> Error {
    Error::unsupported(
        op,
        "the wgpu backend has no f64 (WGSL has no 64-bit floats); use f32 here, or the CPU device \
         (Device::cpu()) for f64 work such as gradient checks",
    )
}

/// Bytes that hold `len` elements (at least one word: wgpu has no empty
/// buffers or bindings).
pub(crate) fn bytes_of(len: usize) -> u64 {
    (len.max(1) as u64) * WORD
}

impl Buffers {
    pub fn alloc(&mut self, ctx: &Context, dtype: DType, len: usize) -> Result<BufferId> {
        const OP: &str = "alloc";
        if dtype == DType::F64 {
            return Err(f64_refused(OP));
        }
        let size = bytes_of(len);
        if size > ctx.limits.max_buffer_size {
            return Err(Error::unsupported(
                OP,
                format!(
                    "a buffer of {len} x {dtype} ({size} bytes) exceeds this device's max_buffer_size of {} \
                     bytes; use smaller tensors (e.g. smaller batches) or the CPU device",
                    ctx.limits.max_buffer_size
                ),
            ));
        }
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        ctx.errors.check(OP)?;
        let stored = Stored { buffer, dtype, len };
        if let Some(id) = self.free_ids.pop() {
            self.slab[id as usize] = Some(stored);
            return Ok(BufferId(id));
        }
        let id = u32::try_from(self.slab.len())
            .map_err(|_| Error::backend(OP, "more than 2^32 buffers on the wgpu backend"))?;
        self.slab.push(Some(stored));
        Ok(BufferId(id))
    }

    /// Drop the slab's handle. Recorded-but-unsubmitted commands hold their
    /// own handles, so the memory lives until they have been submitted.
    pub fn free(&mut self, id: BufferId) {
        if let Some(slot) = self.slab.get_mut(id.0 as usize) {
            if slot.take().is_some() {
                self.free_ids.push(id.0);
            }
        }
    }

    pub fn get(&self, op: &'static str, id: BufferId) -> Result<&Stored> {
        self.slab
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::backend(op, format!("buffer {} does not exist on the wgpu backend (freed?)", id.0)))
    }
}

/// Host data as the words the GPU stores.
pub(crate) fn to_words(data: &HostData) -> Result<Vec<u8>> {
    Ok(match data {
        HostData::F32(v) => bytemuck::cast_slice(v).to_vec(),
        HostData::I32(v) => bytemuck::cast_slice(v).to_vec(),
        HostData::Bool(v) => v.iter().flat_map(|&b| u32::from(b).to_ne_bytes()).collect(),
        HostData::F64(_) => return Err(f64_refused("upload")),
    })
}

/// The first `len` elements of stored words as host data.
pub(crate) fn from_words(dtype: DType, bytes: &[u8], len: usize) -> Result<HostData> {
    let bytes = &bytes[..len * WORD as usize];
    Ok(match dtype {
        DType::F32 => HostData::F32(bytemuck::pod_collect_to_vec(bytes)),
        DType::I32 => HostData::I32(bytemuck::pod_collect_to_vec(bytes)),
        DType::Bool => {
            let words: Vec<u32> = bytemuck::pod_collect_to_vec(bytes);
            HostData::Bool(words.into_iter().map(|w| w != 0).collect())
        }
        DType::F64 => return Err(f64_refused("read")),
    })
}
