//! Training on many processes: data parallelism over MPI.
//!
//! Every process (rank) holds the whole model and trains on its own shard
//! of each global batch ([`DistributedSampler`]); before each optimizer step
//! the ranks replace their gradients by the weighted average over all of
//! them ([`DataParallel`]), so every replica takes the same step and the
//! result matches one process training on the whole batch, up to float
//! summation order — an order that kiln fixes (`buckets.rs`): results are
//! bit-identical run to run for a given number of processes.
//!
//! The sampler and the bucket arithmetic are plain Rust and always built;
//! everything that talks to MPI needs the cargo feature `mpi` (Open MPI or
//! another MPI library, and libclang, at build time). kiln does no
//! networking of its own: the `mpi` crate (rsmpi) calls the MPI library.
//!
//! ```ignore
//! let world = kiln::distributed::World::init()?;
//! let model = models::mlp(&device, &[64, 128, 10], seed)?; // same seed everywhere, or rank 0's wins
//! let mut ddp = DataParallel::new(&world, &model, DataParallelOptions::default())?;
//! let mut optimizer = Adam::new(model.parameters(), 1e-3)?;
//! let sampler = DistributedSampler::new(train.len, 128, world.rank(), world.size(), Some(seed))?;
//! for shard in sampler.epoch(epoch, 0) {
//!     // forward on gather(&train, &shard.indices), then:
//!     optimizer.zero_grad();
//!     let loss = ddp.backward(loss, shard.weight())?;  // the global batch's loss
//!     optimizer.step()?;
//! }
//! ```
//!
//! Failure: a process that returns an error should end the job with
//! [`World::abort_on_error`] (its peers may be waiting for it inside a
//! collective); a panic does so automatically; a collective that waits
//! longer than `KILN_DIST_TIMEOUT` seconds (default 300) aborts the job
//! with a message saying which collective stalled.

pub mod buckets;
mod replicas;
pub mod sampler;

#[cfg(feature = "mpi")]
pub mod bench;
#[cfg(feature = "mpi")]
mod comm;
#[cfg(feature = "mpi")]
mod data_parallel;
#[cfg(feature = "mpi")]
mod handshake;

pub use replicas::{Replicas, SingleProcess};
pub use sampler::{gather, shard_range, DistributedSampler, Shard};

#[cfg(feature = "mpi")]
pub use comm::{BucketBuffers, Comm, World, DEFAULT_TIMEOUT};
#[cfg(feature = "mpi")]
pub use data_parallel::{DataParallel, DataParallelOptions, ExchangeStats};
#[cfg(feature = "mpi")]
pub use handshake::check_same_state;
