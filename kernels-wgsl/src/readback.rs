//! Reading a buffer back to the host.
//!
//! `read` takes a snapshot when it is called: recorded work is submitted,
//! then the buffer is copied into a MAP_READ staging buffer in a submission
//! of its own, so later executions may reuse the buffer while the future is
//! pending (the trait's contract). Staging buffers come from a pool: a read
//! that finishes unmaps its buffer and hands it back (a new one per read cost
//! an allocation of mapped memory each step). `map_async` delivers through a
//! flume channel; natively the future polls the device to completion first,
//! in a browser it awaits the channel (the event loop maps the buffer).

use std::cell::RefCell;
use std::rc::Rc;

use kiln_core::backend::{BufferId, ReadFuture};
use kiln_core::{DType, Error, Result};

use crate::buffers::{bytes_of, from_words};
use crate::WgpuBackend;

type Mapped = flume::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>;

/// Unmapped staging buffers, each of a power-of-two size.
pub(crate) type StagingPool = Rc<RefCell<Vec<wgpu::Buffer>>>;

/// Bytes of staging buffers the pool keeps.
const POOL_BYTES: u64 = 64 << 20;

/// A staging buffer of at least `bytes` (the power of two at or above it,
/// at least 256): one from the pool when it has that size, else a new one.
fn staging_buffer(be: &WgpuBackend, bytes: u64) -> wgpu::Buffer {
    let size = bytes.next_power_of_two().max(256);
    let mut pool = be.staging.borrow_mut();
    if let Some(i) = pool.iter().position(|b| b.size() == size) {
        return pool.swap_remove(i);
    }
    drop(pool);
    be.ctx().device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("kiln readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// Hand an unmapped staging buffer back, unless the pool is full.
fn give_back(pool: &StagingPool, buffer: wgpu::Buffer) {
    let mut pool = pool.borrow_mut();
    let kept: u64 = pool.iter().map(|b| b.size()).sum();
    if kept + buffer.size() <= POOL_BYTES {
        pool.push(buffer);
    }
}

fn snapshot(be: &WgpuBackend, buffer: BufferId, dtype: DType, len: usize) -> Result<(wgpu::Buffer, Mapped)> {
    const OP: &str = "read";
    if dtype == DType::F64 {
        return Err(crate::buffers::f64_refused(OP));
    }
    be.submit()?;
    let ctx = be.ctx();
    let bytes = bytes_of(len);
    let staging = staging_buffer(be, bytes);
    {
        let buffers = be.buffers.borrow();
        let s = buffers.get(OP, buffer)?;
        if s.dtype != dtype || s.len < len {
            return Err(Error::backend(
                OP,
                format!("cannot read {len} x {dtype} from buffer {} ({} x {})", buffer.0, s.len, s.dtype),
            ));
        }
        let mut encoder =
            ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln readback") });
        encoder.copy_buffer_to_buffer(&s.buffer, 0, &staging, 0, bytes);
        ctx.queue.submit([encoder.finish()]);
    }
    ctx.errors.check(OP)?;
    let (tx, rx) = flume::bounded(1);
    staging.map_async(wgpu::MapMode::Read, ..bytes, move |r| {
        let _ = tx.send(r);
    });
    Ok((staging, rx))
}

pub(crate) fn read(be: &WgpuBackend, buffer: BufferId, dtype: DType, len: usize) -> ReadFuture {
    let prepared = snapshot(be, buffer, dtype, len);
    let pool = be.staging.clone();
    let device = be.ctx().device.clone();
    let errors = be.ctx().errors.clone();
    let checks = std::mem::take(&mut *be.pending.borrow_mut());
    #[cfg(target_arch = "wasm32")]
    let (compiles, submit_scopes) = be.pipelines.borrow_mut().take_checks();
    Box::pin(async move {
        const OP: &str = "read";
        let (staging, mapped) = prepared?;
        #[cfg(not(target_arch = "wasm32"))]
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::backend(OP, format!("waiting for the GPU failed: {e}")))?;
        #[cfg(target_arch = "wasm32")]
        let _ = &device;
        // A custom kernel the browser refused fails this read with the
        // compiler's message; what the GPU reported after it (the dispatches
        // that used the broken pipeline, caught in the submissions' scopes
        // or the error slot) is its consequence, dropped.
        #[cfg(target_arch = "wasm32")]
        {
            // Until the consequences of a refused kernel are dropped below.
            let hold = errors.hold();
            let mut refused = None;
            for compile in compiles {
                if let Err(e) = compile.settle().await {
                    refused.get_or_insert(e);
                }
            }
            let mut other = None;
            for scope in submit_scopes {
                if let Some(e) = scope.await {
                    other.get_or_insert(e.to_string());
                }
            }
            if let Some(e) = refused {
                let _ = mapped.recv_async().await;
                let _ = errors.take();
                return Err(e);
            }
            drop(hold);
            if let Some(message) = other {
                return Err(Error::backend(OP, format!("the GPU reported an error: {message}")));
            }
        }
        for check in checks {
            check.settle().await?;
        }
        let result = mapped.recv_async().await.map_err(|_| Error::backend(OP, "the readback was dropped"))?;
        result.map_err(|e| Error::backend(OP, format!("mapping the readback failed: {e}")))?;
        errors.check(OP)?;
        let data = {
            let view = staging
                .get_mapped_range(..bytes_of(len))
                .map_err(|e| Error::backend(OP, format!("reading the mapped buffer failed: {e}")))?;
            from_words(dtype, &view, len)
        };
        staging.unmap();
        give_back(&pool, staging);
        data
    })
}
