//! MPI through rsmpi: the world, communicators, and the few collectives
//! kiln uses. Every collective is started non-blocking and waited for by
//! polling against a deadline, so a process whose peers have stopped
//! answering does not hang: it aborts the whole job with a message (a
//! collective cannot be cancelled, and MPI_Abort is how MPI ends a job).

use std::rc::Rc;
use std::time::{Duration, Instant};

use mpi::collective::{CommunicatorCollectives, Root};
use mpi::datatype::Equivalence;
use mpi::request::{LocalScope, Request, Scope};
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::Threading;

use kiln_core::{Error, Result};

use super::buckets::tree_sum;

/// How long a collective may wait for the other processes before this one
/// gives up and aborts the job. `KILN_DIST_TIMEOUT` (seconds) overrides it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The MPI library's lifetime. MPI_Finalize runs when the last handle goes;
/// while a panic unwinds it runs MPI_Abort instead, because MPI_Finalize
/// waits for every process and the others may be waiting for this one.
struct Universe(Option<mpi::environment::Universe>);

impl Drop for Universe {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kiln distributed: a panic on this process; aborting the job");
            SimpleCommunicator::world().abort(3);
        }
        drop(self.0.take());
    }
}

/// The processes started together (MPI_COMM_WORLD), after MPI is initialised.
pub struct World {
    comm: Comm,
}

impl World {
    /// Initialise MPI (once per process). Started without `mpirun`, the
    /// world is this one process.
    pub fn init() -> Result<World> {
        let (universe, _threading) = mpi::initialize_with_threading(Threading::Funneled)
            .ok_or_else(|| Error::invalid("distributed::World::init", "MPI is already initialised in this process"))?;
        let timeout = match std::env::var("KILN_DIST_TIMEOUT") {
            Ok(text) => {
                Duration::from_secs_f64(text.trim().parse::<f64>().ok().filter(|t| *t > 0.0).ok_or_else(|| {
                    Error::invalid(
                        "distributed::World::init",
                        format!("KILN_DIST_TIMEOUT={text} is not a positive number of seconds"),
                    )
                })?)
            }
            Err(_) => DEFAULT_TIMEOUT,
        };
        let raw = universe.world();
        let comm = Comm::wrap(raw, Rc::new(Universe(Some(universe))), timeout);
        Ok(World { comm })
    }

    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    /// `value`, or — on an error — print the error naming this rank and end
    /// the whole job (MPI_Abort). The other processes may be waiting for
    /// this one inside a collective; returning normally would leave them
    /// there.
    pub fn abort_on_error<T>(&self, result: Result<T>) -> T {
        match result {
            Ok(value) => value,
            Err(e) => {
                eprintln!("error: rank {} of {}: {e}", self.comm.rank, self.comm.size);
                self.comm.raw.abort(1)
            }
        }
    }
}

impl std::ops::Deref for World {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.comm
    }
}

/// A group of processes that exchange data. Fields drop in order: the
/// communicator is freed before the last `Universe` handle finalises MPI.
pub struct Comm {
    raw: SimpleCommunicator,
    rank: usize,
    size: usize,
    timeout: Duration,
    universe: Rc<Universe>,
}

/// How long `wait_all` polls without pause before it backs off.
const POLL_PATIENCE: Duration = Duration::from_secs(2);

/// Elements per MPI call: counts are C ints.
const MAX_COUNT: usize = i32::MAX as usize;

impl Comm {
    fn wrap(raw: SimpleCommunicator, universe: Rc<Universe>, timeout: Duration) -> Comm {
        let rank = raw.rank() as usize;
        let size = raw.size() as usize;
        Comm { raw, rank, size, timeout, universe }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn size(&self) -> usize {
        self.size
    }
    /// Whether this is rank 0 (which logs and writes checkpoints).
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// A communicator over the same processes whose messages never mix
    /// with this one's (MPI_Comm_dup). Collective.
    pub fn duplicate(&self) -> Comm {
        Comm::wrap(self.raw.duplicate(), self.universe.clone(), self.timeout)
    }

    /// A communicator of ranks `0..n` (None on the others). Collective.
    pub fn first(&self, n: usize) -> Option<Comm> {
        let color = if self.rank < n { Color::with_value(0) } else { Color::undefined() };
        self.raw.split_by_color(color).map(|raw| Comm::wrap(raw, self.universe.clone(), self.timeout))
    }

    /// Print `message` naming this rank, then end the whole job.
    pub fn fail(&self, message: &str) -> ! {
        eprintln!("kiln distributed: rank {} of {}: {message}; aborting the job", self.rank, self.size);
        self.raw.abort(2)
    }

    /// Poll `pending` until all are complete, or fail after the timeout.
    pub(crate) fn wait_all<'a, D: ?Sized, S: Scope<'a>>(&self, mut pending: Vec<Request<'a, D, S>>, what: &str) {
        let start = Instant::now();
        while !pending.is_empty() {
            pending = pending.into_iter().filter_map(|r| r.test().err()).collect();
            if pending.is_empty() {
                break;
            }
            if start.elapsed() > self.timeout {
                self.fail(&format!(
                    "{what} did not complete within {:.0} s: another process stopped (it died, hangs, or \
                     failed before this collective); KILN_DIST_TIMEOUT sets the limit",
                    self.timeout.as_secs_f64()
                ));
            }
            // MPI moves a large message only while someone polls it, so
            // poll continuously (yielding the core to any process that
            // needs it) while a transfer may be running; a wait longer than
            // POLL_PATIENCE is a peer busy elsewhere (evaluating, writing a
            // checkpoint), and then one poll a millisecond is enough.
            if start.elapsed() < POLL_PATIENCE {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Test each request once (drives MPI's progress), keeping the
    /// incomplete ones.
    pub(crate) fn progress<'a, D: ?Sized, S: Scope<'a>>(
        pending: Vec<(usize, Request<'a, D, S>)>,
    ) -> Vec<(usize, Request<'a, D, S>)> {
        pending.into_iter().filter_map(|(i, r)| r.test().err().map(|r| (i, r))).collect()
    }

    /// Wait until every process has arrived. Collective.
    pub fn barrier(&self) {
        self.wait_all(vec![self.raw.immediate_barrier()], "barrier")
    }

    /// Overwrite `data` on every process with rank `root`'s. Collective;
    /// every process passes the same length.
    pub fn broadcast<T: Equivalence>(&self, root: usize, data: &mut [T]) {
        for piece in data.chunks_mut(MAX_COUNT) {
            mpi::request::scope(|scope| {
                let r = self.raw.process_at_rank(root as i32).immediate_broadcast_into(scope, piece);
                self.wait_all(vec![r], "broadcast");
            });
        }
    }

    /// Rank `root`'s bytes on every process (any length). Collective.
    pub fn broadcast_bytes(&self, root: usize, bytes: &[u8]) -> Vec<u8> {
        let mut len = [bytes.len() as u64];
        self.broadcast(root, &mut len);
        let mut out = if self.rank == root { bytes.to_vec() } else { vec![0u8; len[0] as usize] };
        self.broadcast(root, &mut out);
        out
    }

    /// Every process's `mine` (same length everywhere), rank after rank.
    pub fn all_gather<T: Equivalence + Copy + Default>(&self, mine: &[T]) -> Vec<T> {
        let mut all = vec![T::default(); mine.len() * self.size];
        mpi::request::scope(|scope| {
            let r = self.raw.immediate_all_gather_into(scope, mine, &mut all[..]);
            self.wait_all(vec![r], "all-gather");
        });
        all
    }

    /// Element-wise sum over processes, in kiln's fixed order (gathered,
    /// then summed with `tree_sum`): the same bits on every rank and run.
    /// For small vectors (metrics, counts).
    pub fn all_sum_f64(&self, values: &mut [f64]) {
        if self.size == 1 {
            return;
        }
        let mut all = self.all_gather(values);
        values.copy_from_slice(tree_sum(&mut all, values.len()));
    }

    /// Sum `data` over processes with kiln's deterministic bucket
    /// all-reduce (see `buckets.rs` for the order), through `buffers`.
    pub fn all_reduce_sum(&self, data: &mut [f32], buffers: &mut BucketBuffers) -> Result<()> {
        buffers.resize(data.len(), self.size)?;
        buffers.send[..data.len()].copy_from_slice(data);
        buffers.send[data.len()..].fill(0.0);
        self.all_reduce_buckets(std::slice::from_mut(buffers));
        data.copy_from_slice(&buffers.out[..data.len()]);
        Ok(())
    }

    /// MPI's own MPI_Allreduce (sum), for comparison in benchmarks only:
    /// its summation order is the library's choice and may change with the
    /// message size or the process count.
    pub fn mpi_all_reduce_sum(&self, data: &[f32], out: &mut [f32]) {
        self.raw.all_reduce_into(data, out, mpi::collective::SystemOperation::sum());
    }

    /// The full exchange of every bucket: scatter phase for all, then
    /// `finish_buckets`.
    pub fn all_reduce_buckets(&self, buckets: &mut [BucketBuffers]) {
        if self.size > 1 {
            mpi::request::scope(|scope| {
                let pending: Vec<_> =
                    buckets.iter_mut().map(|b| self.start_scatter(scope, &b.send, &mut b.recv)).collect();
                self.wait_all(pending, "gradient exchange (scatter)");
            });
        }
        self.finish_buckets(buckets);
    }

    /// Phase one for one bucket: chunk `r` of every process's `send` lands
    /// in `recv` on rank `r`, rank after rank (MPI_Ialltoall; no arithmetic).
    pub(crate) fn start_scatter<'a, 'b>(
        &self,
        scope: &'b LocalScope<'a>,
        send: &'a [f32],
        recv: &'a mut [f32],
    ) -> Request<'a, [f32], &'b LocalScope<'a>> {
        self.raw.immediate_all_to_all_into(scope, send, recv)
    }

    /// Phase two, after phase one completed for every bucket: sum the
    /// received chunks in rank order (`tree_sum`), then gather everyone's
    /// summed chunk into `out` (MPI_Iallgather).
    pub(crate) fn finish_buckets(&self, buckets: &mut [BucketBuffers]) {
        if self.size == 1 {
            for b in buckets.iter_mut() {
                let BucketBuffers { send, out, .. } = b;
                out.copy_from_slice(send);
            }
            return;
        }
        for b in buckets.iter_mut() {
            let chunk = b.mine.len();
            let summed = tree_sum(&mut b.recv, chunk);
            b.mine.copy_from_slice(summed);
        }
        mpi::request::scope(|scope| {
            let pending: Vec<_> = buckets
                .iter_mut()
                .map(|b| self.raw.immediate_all_gather_into(scope, &b.mine[..], &mut b.out[..]))
                .collect();
            self.wait_all(pending, "gradient exchange (gather)");
        });
    }
}

/// The buffers one bucket's exchange uses, kept between steps.
#[derive(Clone, Debug, Default)]
pub struct BucketBuffers {
    /// This process's values, zero-padded to a multiple of the process count.
    pub send: Vec<f32>,
    /// Every process's chunk for this rank, rank after rank.
    recv: Vec<f32>,
    /// This rank's summed chunk.
    mine: Vec<f32>,
    /// The summed bucket, the same on every process.
    pub out: Vec<f32>,
}

impl BucketBuffers {
    /// Buffers for `len` values over `size` processes.
    pub fn new(len: usize, size: usize) -> Result<BucketBuffers> {
        let mut b = BucketBuffers::default();
        b.resize(len, size)?;
        Ok(b)
    }

    /// The buffers phase one reads and writes.
    pub(crate) fn scatter_buffers(&mut self) -> (&mut [f32], &mut [f32]) {
        (&mut self.send, &mut self.recv)
    }

    fn resize(&mut self, len: usize, size: usize) -> Result<()> {
        let chunk = len.div_ceil(size.max(1)).max(1);
        if chunk > MAX_COUNT {
            return Err(Error::unsupported(
                "distributed",
                format!(
                    "a message of {len} values over {size} processes exceeds MPI's count limit; use smaller buckets"
                ),
            ));
        }
        let padded = chunk * size.max(1);
        for v in [&mut self.send, &mut self.recv, &mut self.out] {
            v.clear();
            v.try_reserve_exact(padded).map_err(|e| Error::invalid("distributed", format!("{padded} values: {e}")))?;
            v.resize(padded, 0.0);
        }
        self.mine.clear();
        self.mine.resize(chunk, 0.0);
        Ok(())
    }
}
