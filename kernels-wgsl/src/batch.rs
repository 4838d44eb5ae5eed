//! Command batching: everything one execution records (dispatches, buffer
//! copies) goes into ONE command encoder, submitted once.
//!
//! Dispatches are recorded as plain descriptions and encoded at submission,
//! which lets the whole execution's parameters travel in one write: each
//! dispatch appends its parameter words to a host-side arena at an offset of
//! its own (aligned to `min_storage_buffer_offset_alignment`), the arena is
//! written to a GPU buffer once, and every dispatch binds its own range of it.
//! (Writing each dispatch's parameters into one shared buffer with
//! `queue.write_buffer` would be wrong: all writes land before the submit, so
//! every dispatch would see the last one's parameters.)
//!
//! Index checks (IndexSelect, ScatterAdd) each get a slot of two words in a
//! status buffer that is copied back after the execution; see `Checks`.

use std::rc::Rc;

use kiln_core::{Error, Result};

use crate::context::Context;
use crate::pipelines::Pipeline;
use crate::shaders::Kernel;

/// A binding's resource: a buffer range, or this execution's status buffer.
pub(crate) enum Res {
    Buffer(wgpu::Buffer, u64),
    Status,
}

pub(crate) struct Dispatch {
    pub pipeline: Rc<Pipeline>,
    /// The op, kernel and entry point, for the profile (`profile.rs`,
    /// native only).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub op: &'static str,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub kernel: Kernel,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub entry: &'static str,
    pub bindings: Vec<(u32, Res)>,
    /// Byte range of this dispatch's parameters in the arena.
    pub params: (u64, u64),
    pub groups: [u32; 3],
}

pub(crate) enum Command {
    Dispatch(Dispatch),
    Copy { src: wgpu::Buffer, dst: wgpu::Buffer, bytes: u64 },
}

/// What a status slot checks, for the error message.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CheckMeta {
    pub op: &'static str,
    pub axis: usize,
    pub size: usize,
}

/// A submitted execution's status words on their way back to the host.
pub(crate) struct PendingCheck {
    staging: wgpu::Buffer,
    mapped: flume::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    metas: Vec<CheckMeta>,
}

impl PendingCheck {
    /// Wait (asynchronously) for the status words and report the first bad
    /// slot as the CPU backend would report it.
    pub async fn settle(self) -> Result<()> {
        let mapped = self
            .mapped
            .recv_async()
            .await
            .map_err(|_| Error::backend("flush", "the index check's readback was dropped"))?;
        mapped.map_err(|e| Error::backend("flush", format!("mapping the index check failed: {e}")))?;
        let words: Vec<u32> = {
            let view = self
                .staging
                .get_mapped_range(..)
                .map_err(|e| Error::backend("flush", format!("reading the index check failed: {e}")))?;
            bytemuck::pod_collect_to_vec(&view[..])
        };
        self.staging.unmap();
        for (slot, meta) in self.metas.iter().enumerate() {
            let (pos, value) = (words[2 * slot], words[2 * slot + 1] as i32);
            if pos != u32::MAX {
                return Err(Error::out_of_range(
                    meta.op,
                    format!(
                        "index {value} at position {pos} is out of range for axis {} of size {}",
                        meta.axis, meta.size
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Native: the device has been polled to completion, so the mapping
    /// callback has run and `settle` finishes without waiting.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn settle_now(self) -> Result<()> {
        pollster::block_on(self.settle())
    }
}

#[derive(Default)]
pub(crate) struct Batch {
    commands: Vec<Command>,
    params: Vec<u32>,
    checks: Vec<CheckMeta>,
    /// The GPU side of the parameter arena, grown as needed and reused: the
    /// next execution's write is queued after this one's submission.
    arena: Option<wgpu::Buffer>,
    /// Dispatches recorded since the backend was created (a counter).
    pub dispatches: usize,
    /// Per-kernel timing (`KILN_WGPU_PROFILE`); None normally.
    #[cfg(not(target_arch = "wasm32"))]
    pub profile: Option<crate::profile::Profile>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Append a dispatch's parameters; returns their byte range.
    pub fn push_params(&mut self, ctx: &Context, words: &[u32]) -> (u64, u64) {
        let align = (ctx.limits.min_storage_buffer_offset_alignment.max(4) / 4) as usize;
        let start = self.params.len().div_ceil(align) * align;
        self.params.resize(start, 0);
        self.params.extend_from_slice(words);
        if words.is_empty() {
            self.params.push(0);
        }
        (start as u64 * 4, words.len().max(1) as u64 * 4)
    }

    /// A slot in this execution's status buffer.
    pub fn push_check(&mut self, meta: CheckMeta) -> u32 {
        self.checks.push(meta);
        (self.checks.len() - 1) as u32
    }

    pub fn push(&mut self, command: Command) {
        if let Command::Dispatch(_) = command {
            self.dispatches += 1;
        }
        self.commands.push(command);
    }

    /// Encode everything recorded into one command encoder and submit it.
    /// Returns the status readback when the execution had index checks.
    pub fn submit(&mut self, ctx: &Context) -> Result<Option<PendingCheck>> {
        if self.commands.is_empty() {
            return Ok(None);
        }
        let commands = std::mem::take(&mut self.commands);
        let checks = std::mem::take(&mut self.checks);
        let params = std::mem::take(&mut self.params);
        let device = &ctx.device;

        let param_bytes = (params.len().max(1) * 4) as u64;
        let arena = match self.arena.take() {
            Some(b) if b.size() >= param_bytes => b,
            _ => device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln params"),
                size: param_bytes.next_power_of_two().max(4096),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        if !params.is_empty() {
            ctx.queue.write_buffer(&arena, 0, bytemuck::cast_slice(&params));
        }
        let status_bytes = (checks.len().max(1) * 8) as u64;
        let status = (!checks.is_empty()).then(|| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln index status"),
                size: status_bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        });

        #[cfg(not(target_arch = "wasm32"))]
        let commands = match self.profile.as_mut() {
            Some(profile) => {
                // Already run, one by one; what remains is the status copy.
                profiled(ctx, profile, &commands, &arena, status.as_ref(), status_bytes)?;
                Vec::new()
            }
            None => commands,
        };
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln") });
        let mut i = 0;
        while i < commands.len() {
            match &commands[i] {
                Command::Copy { src, dst, bytes } => {
                    encoder.copy_buffer_to_buffer(src, 0, dst, 0, *bytes);
                    i += 1;
                }
                Command::Dispatch(_) => {
                    // One compute pass for a run of dispatches; wgpu orders
                    // dispatches that share a written buffer.
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                    while let Some(Command::Dispatch(d)) = commands.get(i) {
                        let group = bind_group(device, d, &arena, status.as_ref(), status_bytes);
                        pass.set_pipeline(&d.pipeline.pipeline);
                        pass.set_bind_group(0, &group, &[]);
                        let [x, y, z] = d.groups;
                        pass.dispatch_workgroups(x, y, z);
                        i += 1;
                    }
                }
            }
        }
        let pending = status.map(|status| {
            let staging = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln index status readback"),
                size: status_bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            encoder.copy_buffer_to_buffer(&status, 0, &staging, 0, status_bytes);
            staging
        });
        ctx.queue.submit([encoder.finish()]);
        self.arena = Some(arena);
        ctx.errors.check("flush")?;
        Ok(pending.map(|staging| {
            let (tx, rx) = flume::bounded(1);
            staging.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
            PendingCheck { staging, mapped: rx, metas: checks }
        }))
    }
}

/// The bind group of one dispatch: its parameters' range of the arena
/// (unless its pipeline has them as constants), then its operands.
fn bind_group(
    device: &wgpu::Device,
    d: &Dispatch,
    arena: &wgpu::Buffer,
    status: Option<&wgpu::Buffer>,
    status_bytes: u64,
) -> wgpu::BindGroup {
    let params = d.pipeline.binds_params().then(|| wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: arena,
            offset: d.params.0,
            size: wgpu::BufferSize::new(d.params.1),
        }),
    });
    let entries: Vec<wgpu::BindGroupEntry<'_>> = params
        .into_iter()
        .chain(d.bindings.iter().map(|(binding, res)| {
            let (buffer, size) = match res {
                Res::Buffer(b, size) => (b, *size),
                Res::Status => (status.expect("checks exist"), status_bytes),
            };
            wgpu::BindGroupEntry {
                binding: *binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: 0,
                    size: wgpu::BufferSize::new(size),
                }),
            }
        }))
        .collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &d.pipeline.layout, entries: &entries })
}

/// Profile mode: run each command alone, in order, and wait for it, timing
/// each. The values are the normal ones (same commands, same order).
#[cfg(not(target_arch = "wasm32"))]
fn profiled(
    ctx: &Context,
    profile: &mut crate::profile::Profile,
    commands: &[Command],
    arena: &wgpu::Buffer,
    status: Option<&wgpu::Buffer>,
    status_bytes: u64,
) -> Result<()> {
    let device = &ctx.device;
    let wait = || {
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| Error::backend("flush", format!("waiting for the GPU failed: {e}")))
    };
    // The parameters' write lands with the first submission.
    wait()?;
    for command in commands {
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln") });
        let key = match command {
            Command::Copy { src, dst, bytes } => {
                encoder.copy_buffer_to_buffer(src, 0, dst, 0, *bytes);
                crate::profile::Key { op: "copy", kernel: String::new(), entry: "", groups: [0; 3] }
            }
            Command::Dispatch(d) => {
                let group = bind_group(device, d, arena, status, status_bytes);
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(&d.pipeline.pipeline);
                pass.set_bind_group(0, &group, &[]);
                let [x, y, z] = d.groups;
                pass.dispatch_workgroups(x, y, z);
                crate::profile::Key { op: d.op, kernel: d.kernel.label(), entry: d.entry, groups: d.groups }
            }
        };
        let start = std::time::Instant::now();
        ctx.queue.submit([encoder.finish()]);
        wait()?;
        profile.add(key, start.elapsed());
    }
    Ok(())
}
