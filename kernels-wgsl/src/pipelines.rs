//! Compute pipelines, created on first use and cached by kernel variant and
//! entry point (a shader module is compiled once per variant).

use std::collections::HashMap;
use std::rc::Rc;

use kiln_core::{Error, Result};

use crate::context::Context;
use crate::shaders::Kernel;

pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

#[derive(Default)]
pub(crate) struct Pipelines {
    modules: HashMap<Kernel, wgpu::ShaderModule>,
    pipelines: HashMap<(Kernel, &'static str), Rc<Pipeline>>,
}

impl Pipelines {
    pub fn get(
        &mut self,
        ctx: &Context,
        op: &'static str,
        kernel: Kernel,
        entry: &'static str,
    ) -> Result<Rc<Pipeline>> {
        if let Some(p) = self.pipelines.get(&(kernel, entry)) {
            return Ok(p.clone());
        }
        let label = format!("{}::{entry}", kernel.label());
        let module = match self.modules.get(&kernel) {
            Some(m) => m,
            None => {
                let source = kernel
                    .source()
                    .ok_or_else(|| Error::unsupported(op, format!("the wgpu backend has no kernel {label}")))?;
                let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(&label),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                });
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
        ctx.errors.check(op)?;
        let layout = pipeline.get_bind_group_layout(0);
        let p = Rc::new(Pipeline { pipeline, layout });
        self.pipelines.insert((kernel, entry), p.clone());
        Ok(p)
    }
}
