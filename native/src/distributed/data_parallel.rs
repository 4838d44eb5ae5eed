//! Data parallelism: every process holds the whole model, trains on its own
//! shard of each global batch, and before every optimizer step the
//! processes replace their gradients by the weighted average over all of
//! them, so every replica takes the same step.

use std::ops::Range;
use std::time::Instant;

use kiln_core::checkpoint::named_state;
use kiln_core::nn::Module;
use kiln_core::optim::OptimizerState;
use kiln_core::{BackwardOptions, BufferId, DType, Error, HostData, Param, Result, Tensor};

use super::buckets::BucketPlan;
use super::comm::{BucketBuffers, Comm};
use super::handshake::check_same_state;
use crate::{Blocking, BlockingParam};

/// Knobs of [`DataParallel`].
#[derive(Clone, Copy, Debug)]
pub struct DataParallelOptions {
    /// Largest gradient message, in bytes (a parameter larger than this
    /// travels alone). Small buckets start earlier during backward but pay
    /// the per-message latency more often.
    pub bucket_bytes: usize,
    /// Start a bucket's exchange during backward as soon as its gradients
    /// are computed (CPU devices; see `backward`).
    pub overlap: bool,
}

impl Default for DataParallelOptions {
    fn default() -> Self {
        DataParallelOptions { bucket_bytes: 4 << 20, overlap: true }
    }
}

/// Time spent on the exchange, for the benchmark and the docs.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExchangeStats {
    /// Steps whose gradients were exchanged.
    pub steps: u64,
    /// Seconds from the end of backward to the averaged gradients being
    /// back in the parameters (the exchange time backward did not hide).
    pub exposed_seconds: f64,
    /// Buckets that left during backward.
    pub overlapped_buckets: u64,
}

/// Gradient averaging across the processes of a communicator.
///
/// `new` checks that every process built the same model (the first
/// differing parameter is named in the error, on every process) and copies
/// rank 0's parameters and buffers to the others. Then, each step, call
/// [`DataParallel::backward`] instead of `loss.backward()`: it runs backward
/// and leaves in every parameter's `.grad` the sum over processes of
/// `weight × local gradient`, where `weight` is this process's share of the
/// global batch — which is the gradient of the global batch's mean loss.
///
/// Only f32 parameters and buffers are supported (train in f32; f64 is a
/// CPU reference dtype in kiln). Parameters used in the forward pass but
/// not owned by the module are not exchanged.
pub struct DataParallel {
    params: Vec<Param>,
    buffers: Vec<Param>,
    /// (bucket, range) of each parameter.
    places: Vec<(usize, Range<usize>)>,
    plan: BucketPlan,
    exchange: Vec<BucketBuffers>,
    options: DataParallelOptions,
    stats: ExchangeStats,
    /// Declared last: dropped after the buffers, never before any request.
    comm: Comm,
}

impl DataParallel {
    /// Collective: every process of `comm` calls it with its own copy of
    /// the model.
    #[track_caller]
    pub fn new(comm: &Comm, module: &dyn Module, options: DataParallelOptions) -> Result<DataParallel> {
        const OP: &str = "DataParallel::new";
        if options.bucket_bytes < 4 {
            return Err(Error::invalid(OP, format!("bucket_bytes {} is below one f32", options.bucket_bytes)));
        }
        let comm = comm.duplicate();
        let named_params = module.named_parameters();
        let named_buffers = module.named_buffers();
        let mut description: Vec<(String, String)> =
            vec![("options".to_string(), format!("bucket_bytes {} overlap {}", options.bucket_bytes, options.overlap))];
        for (kind, list) in [("parameter", &named_params), ("buffer", &named_buffers)] {
            for (key, p) in list.iter() {
                description.push((format!("{kind} '{key}'"), format!("{:?} {}", p.dims().as_slice(), p.dtype())));
            }
        }
        // Agree on the model before anything else, so that a mismatch is an
        // error on every process instead of a garbled exchange.
        check_same_state(&comm, &description)?;
        if let Some((key, p)) = named_state(module).iter().find(|(_, p)| p.dtype() != DType::F32) {
            return Err(Error::unsupported(
                OP,
                format!("'{key}' is {}; data-parallel training exchanges f32 tensors only", p.dtype()),
            ));
        }
        // A tied parameter (one Param in two modules) is exchanged once.
        let unique = |list: Vec<(String, Param)>| {
            let mut out: Vec<Param> = Vec::with_capacity(list.len());
            for (_, p) in list {
                if !out.iter().any(|q| q.same(&p)) {
                    out.push(p);
                }
            }
            out
        };
        let params = unique(named_params);
        let buffers = unique(named_buffers);
        broadcast_values(&comm, &params)?;
        broadcast_values(&comm, &buffers)?;
        let numels: Vec<usize> = params.iter().map(Param::numel).collect();
        // Extras: the weighted loss, then one "had a gradient" flag per parameter.
        let plan = BucketPlan::new(&numels, options.bucket_bytes / 4, comm.size(), 1 + params.len());
        let mut places = vec![(0, 0..0); params.len()];
        for (b, bucket) in plan.buckets.iter().enumerate() {
            for slot in &bucket.slots {
                places[slot.param] = (b, slot.range.clone());
            }
        }
        let exchange =
            plan.buckets.iter().map(|b| BucketBuffers::new(b.len, comm.size())).collect::<Result<Vec<_>>>()?;
        Ok(DataParallel { params, buffers, places, plan, exchange, options, stats: ExchangeStats::default(), comm })
    }

    pub fn comm(&self) -> &Comm {
        &self.comm
    }
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }
    pub fn size(&self) -> usize {
        self.comm.size()
    }
    pub fn stats(&self) -> ExchangeStats {
        self.stats
    }
    /// Number of gradient messages per step.
    pub fn buckets(&self) -> usize {
        self.plan.buckets.len()
    }

    /// Backward of this process's loss (the mean over its `local` samples
    /// of a global batch), then the exchange; `weight` = local / global.
    /// Returns the global batch's mean loss, the same on every process.
    ///
    /// On a CPU device with `overlap` on (and no gradient accumulated
    /// before the call), a bucket's exchange starts from inside backward as
    /// soon as its last gradient is computed, and MPI is polled after each
    /// later gradient; on other devices the gradients are read back after
    /// backward, exchanged, and written back.
    ///
    /// Accumulating over micro-batches: call plain `loss.backward()` for
    /// all but the last micro-batch and this for the last; what is
    /// exchanged is the whole accumulated `.grad` times `weight`.
    pub fn backward(&mut self, loss: Tensor<'_>, weight: f64) -> Result<f64> {
        if self.comm.size() == 1 && weight == 1.0 {
            // One process: nothing to exchange.
            loss.backward()?;
            self.stats.steps += 1;
            return loss.item_blocking();
        }
        let fresh = self.params.iter().all(|p| !p.has_grad());
        let on_cpu = loss.graph().device().name().starts_with("cpu");
        if self.options.overlap && fresh && on_cpu && self.comm.size() > 1 {
            return self.backward_overlapped(loss, weight);
        }
        loss.backward()?;
        let value = loss.item_blocking()?;
        self.reduce_gradients(weight, value)
    }

    /// The exchange alone, after the caller's own backward (or with no
    /// backward at all, when this process's shard of the batch is empty:
    /// `weight` 0). `local_loss` is this process's mean loss. Collective.
    pub fn reduce_gradients(&mut self, weight: f64, local_loss: f64) -> Result<f64> {
        let start = Instant::now();
        let mut had = vec![false; self.params.len()];
        for b in &mut self.exchange {
            b.send.fill(0.0);
        }
        for (i, p) in self.params.iter().enumerate() {
            if let Some(grad) = p.grad_blocking()? {
                let HostData::F32(values) = grad else {
                    return Err(Error::unsupported(
                        "DataParallel",
                        format!("{} gradient of '{}'", grad.dtype(), p.name()),
                    ));
                };
                let (b, range) = &self.places[i];
                scale_into(&mut self.exchange[*b].send[range.clone()], &values, weight);
                had[i] = true;
            }
        }
        self.write_extras(weight, local_loss, &had);
        self.comm.all_reduce_buckets(&mut self.exchange);
        let loss = self.unpack()?;
        self.stats.exposed_seconds += start.elapsed().as_secs_f64();
        Ok(loss)
    }

    fn backward_overlapped(&mut self, loss: Tensor<'_>, weight: f64) -> Result<f64> {
        for b in &mut self.exchange {
            b.send.fill(0.0);
        }
        let DataParallel { params, places, plan, exchange, comm, stats, .. } = self;
        let last = plan.buckets.len() - 1;
        let mut had = vec![false; params.len()];
        let mut missing: Vec<usize> = plan.buckets.iter().map(|b| b.slots.len()).collect();
        // (send, recv) of each bucket until its exchange starts.
        let mut parts: Vec<Option<(&mut [f32], &mut [f32])>> = exchange
            .iter_mut()
            .map(|b| {
                let (send, recv) = b.scatter_buffers();
                Some((send, recv))
            })
            .collect();
        let mut overlapped = 0u64;
        let outcome = mpi::request::scope(|scope| {
            let mut pending = Vec::new();
            let mut on_grad = |param: &Param, buffer: BufferId| -> Result<()> {
                let Some(i) = params.iter().position(|p| p.same(param)) else { return Ok(()) };
                let (b, range) = &places[i];
                if had[i] {
                    // One graph has one gradient node per parameter, so this
                    // does not happen; refuse rather than send a partial sum.
                    return Err(Error::invalid(
                        "DataParallel::backward",
                        format!("parameter '{}' got two gradients in one backward pass", param.name()),
                    ));
                }
                let values = read_f32(param, buffer)?;
                let Some((send, _)) = parts[*b].as_mut() else {
                    return Err(Error::invalid("DataParallel::backward", "a gradient arrived after its bucket left"));
                };
                scale_into(&mut send[range.clone()], &values, weight);
                had[i] = true;
                missing[*b] -= 1;
                if missing[*b] == 0 && *b != last {
                    let (send, recv) = parts[*b].take().expect("checked above");
                    pending.push((*b, comm.start_scatter(scope, send, recv)));
                    overlapped += 1;
                }
                // Let MPI move the buckets already in flight.
                pending = Comm::progress(std::mem::take(&mut pending));
                Ok(())
            };
            let result = loss.backward_observed(BackwardOptions::default(), &mut on_grad);
            let backward_done = Instant::now();
            let result = result.and_then(|_| loss.item_blocking()).map(|value| (value, backward_done));
            if let Ok((value, _)) = &result {
                // The extras (loss and flags) ride in the last bucket.
                let (b, at) = plan.extras_at;
                let (send, _) = parts[b].as_mut().expect("the last bucket leaves after backward");
                send[at] = (value * weight) as f32;
                for (flag, &h) in send[at + 1..at + 1 + had.len()].iter_mut().zip(&had) {
                    *flag = if h { 1.0 } else { 0.0 };
                }
                for (b, part) in parts.iter_mut().enumerate() {
                    if let Some((send, recv)) = part.take() {
                        pending.push((b, comm.start_scatter(scope, send, recv)));
                    }
                }
            }
            // Complete whatever was started (the others wait for the same
            // buckets), even when backward failed here.
            comm.wait_all(pending.into_iter().map(|p| p.1).collect(), "gradient exchange (scatter)");
            result
        });
        let (_, start) = outcome?;
        comm.finish_buckets(exchange);
        stats.overlapped_buckets += overlapped;
        let loss = self.unpack()?;
        self.stats.exposed_seconds += start.elapsed().as_secs_f64();
        Ok(loss)
    }

    fn write_extras(&mut self, weight: f64, local_loss: f64, had: &[bool]) {
        let (b, at) = self.plan.extras_at;
        let send = &mut self.exchange[b].send;
        send[at] = (local_loss * weight) as f32;
        for (flag, &h) in send[at + 1..at + 1 + had.len()].iter_mut().zip(had) {
            *flag = if h { 1.0 } else { 0.0 };
        }
    }

    /// Summed gradients back into the parameters; returns the global loss.
    fn unpack(&mut self) -> Result<f64> {
        let (b, at) = self.plan.extras_at;
        let extras = &self.exchange[b].out[at..at + 1 + self.params.len()];
        let loss = f64::from(extras[0]);
        let any: Vec<bool> = extras[1..].iter().map(|&f| f > 0.0).collect();
        for (i, p) in self.params.iter().enumerate() {
            if any[i] {
                let (b, range) = &self.places[i];
                p.set_grad_host(&HostData::F32(self.exchange[*b].out[range.clone()].to_vec()))?;
            } else {
                // No process computed a gradient (an unused parameter):
                // leave it without one, so that the optimizer skips it.
                p.zero_grad();
            }
        }
        if !self.buffers.is_empty() {
            // Running statistics drift apart on different shards; rank 0's
            // win, as in PyTorch's DistributedDataParallel.
            broadcast_values(&self.comm, &self.buffers)?;
        }
        self.stats.steps += 1;
        Ok(loss)
    }

    /// Copy rank 0's parameters and buffers to every process again (after
    /// rank 0 loaded a checkpoint, say). Collective.
    pub fn broadcast_model(&self) -> Result<()> {
        broadcast_values(&self.comm, &self.params)?;
        broadcast_values(&self.comm, &self.buffers)
    }

    /// Copy rank 0's optimizer state (step count, learning rate, moment
    /// buffers) to every process. Collective; all must use the same kind of
    /// optimizer over this model's parameters.
    pub fn broadcast_optimizer<O: OptimizerState>(&self, optimizer: &mut O) -> Result<()> {
        const OP: &str = "DataParallel::broadcast_optimizer";
        let state = pollster::block_on(optimizer.read_state())?;
        let flat_len: usize = state.iter().flatten().map(HostData::len).sum();
        let lengths = self.comm.all_gather(&[flat_len as u64]);
        if lengths.iter().any(|&l| l != lengths[0]) {
            return Err(Error::invalid(OP, format!("the processes' optimizer states differ in size: {lengths:?}")));
        }
        let mut header = [optimizer.step_count() as f64, optimizer.learning_rate()];
        self.comm.broadcast(0, &mut header);
        let mut flat: Vec<f32> = Vec::with_capacity(flat_len);
        for data in state.iter().flatten() {
            match data {
                HostData::F32(v) => flat.extend_from_slice(v),
                other => return Err(Error::unsupported(OP, format!("{} optimizer state", other.dtype()))),
            }
        }
        self.comm.broadcast(0, &mut flat);
        if !self.comm.is_root() {
            let mut at = 0;
            let restored: Vec<Vec<HostData>> = state
                .iter()
                .map(|slots| {
                    slots
                        .iter()
                        .map(|d| {
                            let v = HostData::F32(flat[at..at + d.len()].to_vec());
                            at += d.len();
                            v
                        })
                        .collect()
                })
                .collect();
            optimizer.write_state(&restored)?;
            optimizer.set_step_count(header[0] as u64);
            optimizer.set_learning_rate(header[1])?;
        }
        Ok(())
    }
}

/// `into[k] = values[k] · weight` (a plain copy when the weight is 1).
fn scale_into(into: &mut [f32], values: &[f32], weight: f64) {
    if weight == 1.0 {
        into.copy_from_slice(values);
    } else {
        let w = weight as f32;
        for (d, &v) in into.iter_mut().zip(values) {
            *d = v * w;
        }
    }
}

fn read_f32(param: &Param, buffer: BufferId) -> Result<Vec<f32>> {
    match pollster::block_on(param.device().backend().read(buffer, param.dtype(), param.numel()))? {
        HostData::F32(v) => Ok(v),
        other => Err(Error::unsupported("DataParallel", format!("{} gradient", other.dtype()))),
    }
}

/// Rank 0's values of `params` on every process, in one message per
/// dtype-homogeneous batch (all f32 here, checked by the caller).
fn broadcast_values(comm: &Comm, params: &[Param]) -> Result<()> {
    if comm.size() == 1 || params.is_empty() {
        return Ok(());
    }
    let mut flat: Vec<f32> = Vec::with_capacity(params.iter().map(Param::numel).sum());
    for p in params {
        match p.value_blocking()? {
            HostData::F32(v) => flat.extend_from_slice(&v),
            other => {
                return Err(Error::unsupported("DataParallel", format!("{} parameter '{}'", other.dtype(), p.name())))
            }
        }
    }
    comm.broadcast(0, &mut flat);
    if !comm.is_root() {
        let mut at = 0;
        for p in params {
            p.set_value(&HostData::F32(flat[at..at + p.numel()].to_vec()))?;
            at += p.numel();
        }
    }
    Ok(())
}

/// The training loops' view (`kiln train`, `gpt::train_step_with`).
impl super::Replicas for DataParallel {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn backward(&mut self, loss: Option<Tensor<'_>>, weight: f64) -> Result<f64> {
        match loss {
            Some(loss) => DataParallel::backward(self, loss, weight),
            None => self.reduce_gradients(0.0, 0.0),
        }
    }
    fn sum(&mut self, values: &mut [f64]) -> Result<()> {
        self.comm.all_sum_f64(values);
        Ok(())
    }
}
