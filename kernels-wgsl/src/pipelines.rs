//! Compute pipelines, created on first use and cached by kernel variant and
//! entry point (a shader module is compiled once per variant).
//!
//! In a browser, a custom op's kernel was only read for its interface when
//! the op was registered (the browser package leaves naga out), so its
//! compilation is checked here: the browser's compiler messages
//! (`GPUShaderModule.getCompilationInfo`) and the validation errors of its
//! module and pipeline (caught in an error scope) are awaited by the next
//! `read`, which fails with them; later uses of the kernel fail at once.

#[cfg(target_arch = "wasm32")]
use std::cell::RefCell;
use std::collections::HashMap;
#[cfg(target_arch = "wasm32")]
use std::future::Future;
#[cfg(target_arch = "wasm32")]
use std::pin::Pin;
use std::rc::Rc;

use kiln_core::{Error, Result};

use crate::context::Context;
use crate::shaders::Kernel;

/// A shader module: of kiln's own WGSL (`own`), or of a user's custom
/// kernel, which keeps every check.
///
/// wgpu's default runtime checks make naga add, besides bounds checks, a
/// counter to every loop that ends it after 2^64 iterations, so that a
/// driver may not assume an infinite loop away; the counter keeps drivers
/// from unrolling and strength-reducing the loops. kiln's kernels bound
/// every loop by construction (a counter stepped towards an end below
/// 2^32 - step: the host sizes everything in u32 words and no buffer holds
/// 2^30 words), so natively their modules are made without the counter.
/// Bounds checks stay. `KILN_WGPU_LOOP_BOUNDING=1` keeps the counter (to
/// compare). Browsers add their own checks whatever wgpu asks.
fn shader_module(ctx: &Context, label: &str, source: &str, own: bool) -> wgpu::ShaderModule {
    let desc = wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(source.into()) };
    #[cfg(not(target_arch = "wasm32"))]
    if own && std::env::var("KILN_WGPU_LOOP_BOUNDING").as_deref() != Ok("1") {
        let checks = wgpu::ShaderRuntimeChecks { force_loop_bounding: false, ..wgpu::ShaderRuntimeChecks::checked() };
        // SAFETY: the one check turned off is loop bounding, whose
        // requirement is that the shader has no infinite loop; kiln's own
        // kernels only loop over counted ranges whose ends fit in u32 with
        // room for the step (see above); `own` is false for custom kernels.
        return unsafe { ctx.device.create_shader_module_trusted(desc, checks) };
    }
    #[cfg(target_arch = "wasm32")]
    let _ = own;
    ctx.device.create_shader_module(desc)
}

pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    /// Whether binding 0 takes the dispatch's parameters (false for a
    /// shape-specialised pipeline, whose parameters are constants; the
    /// browser build has none, see `binds_params`).
    #[cfg(not(target_arch = "wasm32"))]
    pub binds_params: bool,
    /// The text of a generated pipeline, for its specialisations.
    #[cfg(not(target_arch = "wasm32"))]
    pub source: Option<String>,
}

impl Pipeline {
    /// Whether binding 0 takes the dispatch's parameters.
    pub fn binds_params(&self) -> bool {
        #[cfg(not(target_arch = "wasm32"))]
        return self.binds_params;
        #[cfg(target_arch = "wasm32")]
        true
    }
}

#[derive(Default)]
pub(crate) struct Pipelines {
    modules: HashMap<Kernel, wgpu::ShaderModule>,
    pipelines: HashMap<(Kernel, &'static str), Rc<Pipeline>>,
    /// Pipelines created, and requests the cache answered.
    pub compiled: usize,
    pub hits: usize,
    /// Time spent creating pipelines (all, and the generated fused ones,
    /// also counted apart), for the profile's table.
    #[cfg(not(target_arch = "wasm32"))]
    pub compile_time: std::time::Duration,
    #[cfg(not(target_arch = "wasm32"))]
    pub fused: (usize, std::time::Duration),
    /// Shape-specialised pipelines (specialize.rs).
    #[cfg(not(target_arch = "wasm32"))]
    pub specializer: crate::specialize::Specializer,
    /// Custom kernels the browser refused, with the error to repeat.
    #[cfg(target_arch = "wasm32")]
    refused: HashMap<Kernel, Rc<RefCell<Option<Error>>>>,
    /// Compilations of custom kernels not yet awaited.
    #[cfg(target_arch = "wasm32")]
    checks: Vec<CompileCheck>,
    /// Validation errors of submissions made while `checks` was not empty.
    #[cfg(target_arch = "wasm32")]
    submit_scopes: Vec<Scope>,
}

#[cfg(target_arch = "wasm32")]
pub(crate) type Scope = Pin<Box<dyn Future<Output = Option<wgpu::Error>>>>;

impl Pipelines {
    pub fn get(
        &mut self,
        ctx: &Context,
        op: &'static str,
        kernel: Kernel,
        entry: &'static str,
    ) -> Result<Rc<Pipeline>> {
        #[cfg(target_arch = "wasm32")]
        if let Some(e) = self.refused.get(&kernel).and_then(|v| v.borrow().clone()) {
            return Err(e);
        }
        if let Some(p) = self.pipelines.get(&(kernel, entry)) {
            self.hits += 1;
            return Ok(p.clone());
        }
        #[cfg(not(target_arch = "wasm32"))]
        let started = std::time::Instant::now();
        #[cfg(target_arch = "wasm32")]
        let scope = match kernel {
            Kernel::Custom(_) => Some(ctx.device.push_error_scope(wgpu::ErrorFilter::Validation)),
            _ => None,
        };
        let label = format!("{}::{entry}", kernel.label());
        let module = match self.modules.get(&kernel) {
            Some(m) => m,
            None => {
                let source = kernel
                    .source()
                    .ok_or_else(|| Error::unsupported(op, format!("the wgpu backend has no kernel {label}")))?;
                let module = shader_module(ctx, &label, &source, !matches!(kernel, Kernel::Custom(_)));
                ctx.errors.check(op)?;
                self.modules.entry(kernel).or_insert(module)
            }
        };
        let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        // After get_bind_group_layout, which fails too on a refused kernel.
        #[cfg(target_arch = "wasm32")]
        if let (Some(scope), Kernel::Custom(custom)) = (scope, kernel) {
            let verdict = Rc::new(RefCell::new(None));
            self.refused.insert(kernel, verdict.clone());
            self.checks.push(CompileCheck {
                hold: ctx.errors.hold(),
                op: custom.name(),
                info: Box::pin(module.get_compilation_info()),
                scope: Box::pin(scope.pop()),
                verdict,
            });
        }
        ctx.errors.check(op)?;
        let p = Rc::new(Pipeline {
            pipeline,
            layout,
            #[cfg(not(target_arch = "wasm32"))]
            binds_params: true,
            #[cfg(not(target_arch = "wasm32"))]
            source: None,
        });
        self.pipelines.insert((kernel, entry), p.clone());
        self.compiled += 1;
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.compile_time += started.elapsed();
        }
        Ok(p)
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Pipelines {
    /// A pipeline of the entry point `main` of generated WGSL (a fused
    /// kernel; its caller caches it). wgpu parses and validates the source
    /// with naga before creating the pipeline.
    pub fn compile(&mut self, ctx: &Context, op: &'static str, label: &str, source: &str) -> Result<Rc<Pipeline>> {
        let started = std::time::Instant::now();
        let (pipeline, layout) = self.create(ctx, op, label, source, "main")?;
        let took = started.elapsed();
        self.fused.0 += 1;
        self.fused.1 += took;
        Ok(Rc::new(Pipeline { pipeline, layout, binds_params: true, source: Some(source.to_string()) }))
    }

    /// A shape-specialised pipeline of `entry` of `source` (specialize.rs;
    /// its parameters are constants, so it binds none).
    pub fn compile_specialized(
        &mut self,
        ctx: &Context,
        op: &'static str,
        label: &str,
        source: &str,
        entry: &str,
    ) -> Result<Rc<Pipeline>> {
        let (pipeline, layout) = self.create(ctx, op, label, source, entry)?;
        Ok(Rc::new(Pipeline { pipeline, layout, binds_params: false, source: None }))
    }

    fn create(
        &mut self,
        ctx: &Context,
        op: &'static str,
        label: &str,
        source: &str,
        entry: &str,
    ) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
        let started = std::time::Instant::now();
        let module = shader_module(ctx, label, source, true);
        ctx.errors.check(op)?;
        let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        ctx.errors.check(op)?;
        self.compiled += 1;
        self.compile_time += started.elapsed();
        Ok((pipeline, layout))
    }
}

#[cfg(target_arch = "wasm32")]
impl Pipelines {
    /// The compilations a `read` must await, and the error scopes of the
    /// submissions made meanwhile.
    pub fn take_checks(&mut self) -> (Vec<CompileCheck>, Vec<Scope>) {
        (std::mem::take(&mut self.checks), std::mem::take(&mut self.submit_scopes))
    }

    /// Whether a custom kernel's compilation awaits its check.
    pub fn checking(&self) -> bool {
        !self.checks.is_empty()
    }

    pub fn add_submit_scope(&mut self, scope: Scope) {
        self.submit_scopes.push(scope);
    }
}

/// A custom kernel's compilation in the browser, on its way to a verdict.
#[cfg(target_arch = "wasm32")]
pub(crate) struct CompileCheck {
    /// Keeps the error slot's reports for the read that settles this check.
    hold: crate::context::HoldGuard,
    op: &'static str,
    info: Pin<Box<dyn Future<Output = wgpu::CompilationInfo>>>,
    scope: Scope,
    verdict: Rc<RefCell<Option<Error>>>,
}

#[cfg(target_arch = "wasm32")]
impl CompileCheck {
    /// The compiler's errors (with the user's line and column: kiln's
    /// prelude comes after their code), else the module's or pipeline's
    /// validation error, as this custom op's error.
    pub async fn settle(self) -> Result<()> {
        let name = self.op;
        let messages: Vec<String> = self
            .info
            .await
            .messages
            .into_iter()
            .filter(|m| m.message_type == wgpu::CompilationMessageType::Error)
            .map(|m| match m.location {
                Some(at) => format!("wgsl:{}:{}: {}", at.line_number, at.line_position, m.message),
                None => m.message,
            })
            .collect();
        let scope = self.scope.await;
        drop(self.hold);
        let error = if !messages.is_empty() {
            format!("the browser's WebGPU compiler refused it:\n{}", messages.join("\n"))
        } else if let Some(e) = scope {
            format!("the browser refused its pipeline: {e}")
        } else {
            return Ok(());
        };
        let error = Error::invalid(name, format!("custom op {name}: WGSL kernel: {error}"));
        *self.verdict.borrow_mut() = Some(error.clone());
        Err(error)
    }
}
