//! Per-step graphs and tensor handles for JavaScript.
//!
//! In Rust a `Tensor<'g>` borrows its `Graph`, so a reset cannot happen
//! while a handle is alive. JavaScript has no lifetimes, so here a handle is
//! plain data: the graph, the step (generation) and kiln-core's `TensorId`.
//! The graph's generation counter moves on every `reset()`, and a handle
//! from an older generation is refused with a clear error instead of
//! reading whatever node now has its id.
//!
//! One step's `kiln_core::Graph` lives in a reference-counted [`Slot`].
//! Every call borrows the slot's graph for its own duration and turns ids
//! back into `Tensor<'_>` with the checked `Graph::tensor_by_id`, so no
//! borrow outlives the call (no `unsafe`). A pending read owns an
//! `Rc<Slot>` inside its future; `reset()` resets the graph in place when
//! nothing else holds the slot, and starts a fresh slot when a read still
//! holds the old one (dropped when the read completes).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};

use kiln_core::{DType, Device, Graph as CoreGraph, HostData, Tensor as CoreTensor, TensorId};

use crate::error::{KilnError, Res};

thread_local! {
    static NEXT_GRAPH_ID: Cell<u32> = const { Cell::new(1) };
    static LIVE_HANDLES: Cell<u32> = const { Cell::new(0) };
    /// This thread's JS graphs, so that code kiln-core calls back with a
    /// core graph (a custom op's JavaScript backward) can hand JS handles
    /// of it out (`js_graph_of`).
    static LIVE_GRAPHS: RefCell<Vec<Weak<GraphShared>>> = const { RefCell::new(Vec::new()) };
}

/// Counts itself in [`live_handles`]: one per `Tensor` handle in wasm
/// memory (a handle's small allocation lives until JS frees it: at
/// `graph.reset()`, `free()`, or when the GC finalises it).
pub(crate) struct HandleCount(());

impl HandleCount {
    fn new() -> HandleCount {
        LIVE_HANDLES.with(|n| n.set(n.get() + 1));
        HandleCount(())
    }
}

impl Clone for HandleCount {
    fn clone(&self) -> HandleCount {
        HandleCount::new()
    }
}

impl Drop for HandleCount {
    fn drop(&mut self) {
        LIVE_HANDLES.with(|n| n.set(n.get() - 1));
    }
}

/// `Tensor` handles alive in wasm memory.
pub fn live_handles() -> u32 {
    LIVE_HANDLES.with(Cell::get)
}

/// The JS graph whose live step is `core`, with that step's slot.
pub(crate) fn js_graph_of(core: &CoreGraph) -> Option<(Rc<GraphShared>, Rc<Slot>)> {
    LIVE_GRAPHS.with(|list| {
        list.borrow().iter().filter_map(Weak::upgrade).find_map(|shared| {
            let slot = shared.slot.borrow().clone()?;
            std::ptr::eq(&slot.graph, core).then(|| (shared.clone(), slot))
        })
    })
}

/// One step's graph.
pub(crate) struct Slot {
    pub(crate) graph: CoreGraph,
    generation: u64,
}

impl Slot {
    fn new(device: &Device, generation: u64) -> Rc<Slot> {
        Rc::new(Slot { graph: CoreGraph::new(device), generation })
    }

    /// The core tensor a handle names (checked by kiln-core).
    pub(crate) fn get(&self, id: TensorId) -> Res<CoreTensor<'_>> {
        Ok(self.graph.tensor_by_id(id)?)
    }
}

pub(crate) struct GraphShared {
    device: Device,
    pub(crate) id: u32,
    slot: RefCell<Option<Rc<Slot>>>,
    generation: Cell<u64>,
}

impl GraphShared {
    fn current(&self) -> Res<Rc<Slot>> {
        self.slot.borrow().clone().ok_or_else(|| {
            KilnError::new(
                "StaleTensor",
                "Graph",
                format!("graph #{} was freed; make a new graph with kiln.graph()", self.id),
            )
        })
    }

    /// The live slot, provided it is still at `generation`.
    fn slot_at(&self, generation: u64, what: &str) -> Res<Rc<Slot>> {
        let slot = self.current()?;
        if slot.generation != generation {
            return Err(KilnError::new(
                "StaleTensor",
                "Tensor",
                format!(
                    "{what} belongs to step {generation} of graph #{}, which was reset and is now at step {}; \
                     tensors live for one step: make new ones after graph.reset()",
                    self.id, slot.generation
                ),
            ));
        }
        Ok(slot)
    }

    /// The JS handle of a tensor just made in `slot`.
    pub(crate) fn register(self: &Rc<Self>, slot: &Slot, tensor: CoreTensor<'_>) -> Tensor {
        Tensor {
            graph: self.clone(),
            generation: slot.generation,
            id: tensor.tensor_id(),
            _counted: HandleCount::new(),
        }
    }
}

/// A computation graph for one training step (or one evaluation).
///
/// Build tensors with `tensor()`, `variable()`, `param()`; combine them with
/// the `Tensor` methods; read values with the Promise-returning `toArray()`
/// and `item()`. Call `reset()` before the next step: it frees every
/// intermediate buffer at once, and every `Tensor` of the old step becomes
/// stale (using one throws a `KilnError` of kind `"StaleTensor"`).
#[wasm_bindgen::prelude::wasm_bindgen]
pub struct Graph {
    pub(crate) shared: Rc<GraphShared>,
}

/// A handle to one value of one step of a `Graph`. Cheap to create and to
/// drop; it holds no device memory itself (the graph does, until its reset).
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone)]
pub struct Tensor {
    pub(crate) graph: Rc<GraphShared>,
    pub(crate) generation: u64,
    pub(crate) id: TensorId,
    _counted: HandleCount,
}

impl Graph {
    pub(crate) fn create(device: &Device) -> Graph {
        let id = NEXT_GRAPH_ID.with(|n| {
            let id = n.get();
            n.set(id + 1);
            id
        });
        let shared = Rc::new(GraphShared {
            device: device.clone(),
            id,
            slot: RefCell::new(Some(Slot::new(device, 1))),
            generation: Cell::new(1),
        });
        LIVE_GRAPHS.with(|list| {
            let mut list = list.borrow_mut();
            list.retain(|w| w.strong_count() > 0);
            list.push(Rc::downgrade(&shared));
        });
        Graph { shared }
    }

    /// Run `f` on the live graph and register the tensor it returns.
    // The generic wrappers here and in `Tensor` (`map`, `map2`, ...) only
    // take a reference to the closure: their bodies exist once, not once per
    // JS method (−N KB of the wasm, web/README.md, Size).
    #[inline(always)]
    pub(crate) fn make(&self, f: impl for<'g> Fn(&'g CoreGraph) -> kiln_core::Result<CoreTensor<'g>>) -> Res<Tensor> {
        self.make_dyn(&f)
    }

    #[inline(never)]
    fn make_dyn(&self, f: &dyn for<'g> Fn(&'g CoreGraph) -> kiln_core::Result<CoreTensor<'g>>) -> Res<Tensor> {
        let slot = self.shared.current()?;
        let tensor = f(&slot.graph)?;
        Ok(self.shared.register(&slot, tensor))
    }

    pub(crate) fn slot(&self) -> Res<Rc<Slot>> {
        self.shared.current()
    }

    /// Start the next step (see the type docs).
    pub fn reset_graph(&self) {
        let generation = self.shared.generation.get() + 1;
        self.shared.generation.set(generation);
        let mut cell = self.shared.slot.borrow_mut();
        let Some(slot) = cell.as_mut() else { return };
        match Rc::get_mut(slot) {
            // Nothing else holds the step: reset in place, keeping the
            // arenas' capacity (O(1) in the node count).
            Some(unique) => {
                unique.graph.reset();
                unique.generation = generation;
            }
            // A read is still pending on the old step: it keeps that graph
            // alive until it completes; this one starts afresh.
            None => *slot = Slot::new(&self.shared.device, generation),
        }
    }

    /// Make the graph unusable and release the step now (its tensors become
    /// stale). Pending reads keep what they need until they complete.
    pub(crate) fn close(&self) {
        let old = self.shared.slot.borrow_mut().take();
        drop(old);
    }

    pub(crate) fn generation_now(&self) -> u64 {
        self.shared.generation.get()
    }

    pub(crate) fn id_number(&self) -> u32 {
        self.shared.id
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor(graph #{}, step {}, #{})", self.graph.id, self.generation, self.id.node())
    }
}

impl Tensor {
    /// The live slot of this tensor's step, or the stale error.
    pub(crate) fn slot(&self) -> Res<Rc<Slot>> {
        self.graph.slot_at(self.generation, "this tensor")
    }

    /// Run `f` on this tensor's core handle.
    pub(crate) fn with<R>(&self, f: impl for<'g> FnOnce(CoreTensor<'g>) -> Res<R>) -> Res<R> {
        let slot = self.slot()?;
        let t = slot.get(self.id)?;
        f(t)
    }

    /// Another tensor of the same graph, in `slot` (its step must be live).
    pub(crate) fn same<'s>(&self, op: &'static str, slot: &'s Slot, other: &Tensor) -> Res<CoreTensor<'s>> {
        if !Rc::ptr_eq(&self.graph, &other.graph) {
            return Err(KilnError::new(
                "InvalidArgument",
                op,
                format!(
                    "{op}: operands belong to different graphs (#{} and #{}); build both in one graph",
                    self.graph.id, other.graph.id
                ),
            ));
        }
        other.graph.slot_at(other.generation, "the other operand")?;
        slot.get(other.id)
    }

    /// Apply a core op to this tensor and register the result.
    #[inline(always)]
    pub(crate) fn map(&self, f: impl for<'g> Fn(CoreTensor<'g>) -> kiln_core::Result<CoreTensor<'g>>) -> Res<Tensor> {
        self.map_dyn(&f)
    }

    #[inline(never)]
    fn map_dyn(&self, f: &dyn for<'g> Fn(CoreTensor<'g>) -> kiln_core::Result<CoreTensor<'g>>) -> Res<Tensor> {
        let slot = self.slot()?;
        let out = f(slot.get(self.id)?)?;
        Ok(self.graph.register(&slot, out))
    }

    /// Apply a core op that gives several tensors (split, chunk).
    #[inline(always)]
    pub(crate) fn map_to_many(
        &self,
        f: impl for<'g> Fn(CoreTensor<'g>) -> kiln_core::Result<Vec<CoreTensor<'g>>>,
    ) -> Res<Vec<Tensor>> {
        self.map_to_many_dyn(&f)
    }

    #[inline(never)]
    fn map_to_many_dyn(
        &self,
        f: &dyn for<'g> Fn(CoreTensor<'g>) -> kiln_core::Result<Vec<CoreTensor<'g>>>,
    ) -> Res<Vec<Tensor>> {
        let slot = self.slot()?;
        let out = f(slot.get(self.id)?)?;
        Ok(out.into_iter().map(|t| self.graph.register(&slot, t)).collect())
    }

    /// Apply a core op to two tensors of the same step.
    #[inline(always)]
    pub(crate) fn map2(
        &self,
        other: &Tensor,
        op: &'static str,
        f: impl for<'g> Fn(CoreTensor<'g>, CoreTensor<'g>) -> kiln_core::Result<CoreTensor<'g>>,
    ) -> Res<Tensor> {
        self.map2_dyn(other, op, &f)
    }

    #[inline(never)]
    fn map2_dyn(
        &self,
        other: &Tensor,
        op: &'static str,
        f: &dyn for<'g> Fn(CoreTensor<'g>, CoreTensor<'g>) -> kiln_core::Result<CoreTensor<'g>>,
    ) -> Res<Tensor> {
        let slot = self.slot()?;
        let a = slot.get(self.id)?;
        let b = self.same(op, &slot, other)?;
        let out = f(a, b)?;
        Ok(self.graph.register(&slot, out))
    }

    /// Apply a core op to three tensors of the same step.
    #[inline(always)]
    pub(crate) fn map3(
        &self,
        b: &Tensor,
        c: &Tensor,
        op: &'static str,
        f: impl for<'g> Fn(CoreTensor<'g>, CoreTensor<'g>, CoreTensor<'g>) -> kiln_core::Result<CoreTensor<'g>>,
    ) -> Res<Tensor> {
        self.map3_dyn(b, c, op, &f)
    }

    #[inline(never)]
    fn map3_dyn(
        &self,
        b: &Tensor,
        c: &Tensor,
        op: &'static str,
        f: &dyn for<'g> Fn(CoreTensor<'g>, CoreTensor<'g>, CoreTensor<'g>) -> kiln_core::Result<CoreTensor<'g>>,
    ) -> Res<Tensor> {
        let slot = self.slot()?;
        let ta = slot.get(self.id)?;
        let tb = self.same(op, &slot, b)?;
        let tc = self.same(op, &slot, c)?;
        let out = f(ta, tb, tc)?;
        Ok(self.graph.register(&slot, out))
    }

    /// Apply a core op to many tensors of one step (concat).
    #[inline(always)]
    pub(crate) fn map_many(
        tensors: &[Tensor],
        op: &'static str,
        f: impl for<'g> Fn(&[CoreTensor<'g>]) -> kiln_core::Result<CoreTensor<'g>>,
    ) -> Res<Tensor> {
        Tensor::map_many_dyn(tensors, op, &f)
    }

    #[inline(never)]
    fn map_many_dyn(
        tensors: &[Tensor],
        op: &'static str,
        f: &dyn for<'g> Fn(&[CoreTensor<'g>]) -> kiln_core::Result<CoreTensor<'g>>,
    ) -> Res<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(KilnError::argument(op, "needs at least one tensor"));
        };
        let slot = first.slot()?;
        let core = tensors.iter().map(|t| first.same(op, &slot, t)).collect::<Res<Vec<_>>>()?;
        let out = f(&core)?;
        Ok(first.graph.register(&slot, out))
    }

    /// Start reading the values: the graph runs now (so the values read are
    /// those of this moment, whatever happens to parameters afterwards) and
    /// the returned future completes when the device has copied them out.
    pub(crate) fn read(&self) -> Res<ReadFuture> {
        let slot = self.slot()?;
        let id = self.id;
        // The future owns the slot (so the graph lives until the read is
        // done) and borrows the graph from it inside itself.
        let future: Pin<Box<dyn Future<Output = kiln_core::Result<HostData>>>> = Box::pin(async move {
            let tensor = slot.graph.tensor_by_id(id)?;
            tensor.to_host().await
        });
        Ok(ReadFuture::start(future))
    }

    pub(crate) fn core_dtype(&self) -> Res<DType> {
        self.with(|t| Ok(t.dtype()))
    }
}

/// A read in progress. Polled once on creation, so the graph executes (and
/// the backend snapshots the buffer) before control returns to JavaScript.
pub(crate) enum ReadFuture {
    Done(Option<kiln_core::Result<HostData>>),
    Pending(Pin<Box<dyn Future<Output = kiln_core::Result<HostData>>>>),
}

impl ReadFuture {
    fn start(mut future: Pin<Box<dyn Future<Output = kiln_core::Result<HostData>>>>) -> ReadFuture {
        let mut cx = Context::from_waker(Waker::noop());
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(result) => ReadFuture::Done(Some(result)),
            Poll::Pending => ReadFuture::Pending(future),
        }
    }
}

impl Future for ReadFuture {
    type Output = Res<HostData>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Res<HostData>> {
        match self.get_mut() {
            ReadFuture::Done(result) => {
                Poll::Ready(result.take().expect("polled after completion").map_err(Into::into))
            }
            ReadFuture::Pending(future) => future.as_mut().poll(cx).map(|r| r.map_err(Into::into)),
        }
    }
}

pub(crate) fn parse_dtype(op: &'static str, name: Option<String>) -> Res<DType> {
    match name.as_deref() {
        None | Some("float32") | Some("f32") => Ok(DType::F32),
        Some("int32") | Some("i32") => Ok(DType::I32),
        Some("float64") | Some("f64") => Ok(DType::F64),
        Some("bool") => Ok(DType::Bool),
        Some(other) => Err(KilnError::argument(
            op,
            format!("unknown dtype '{other}'; use 'float32', 'int32', 'float64' or 'bool'"),
        )),
    }
}

pub(crate) fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::I32 => "int32",
        DType::F64 => "float64",
        DType::Bool => "bool",
    }
}
