//! Random element-wise chains for the fusion tests (CPU and wgpu): the same
//! seed builds the same graph on any device, so outcomes can be compared
//! bit for bit (fusion on/off, cut groups) or within a tolerance (wgpu vs
//! CPU).

use kiln::{Blocking, Device, Graph, Tensor};

/// A small deterministic generator (tests must not depend on a crate's
/// random stream).
pub struct Lcg(u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn uniform(&mut self) -> f32 {
        (self.next() % 2_000_000) as f32 / 1_000_000.0 - 1.0
    }
}

/// Everything a random chain computes: read values, the loss, gradients.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub reads: Vec<Vec<f32>>,
    pub loss: f32,
    pub grads: Vec<Vec<f32>>,
}

impl Outcome {
    pub fn bits(&self) -> (Vec<Vec<u32>>, u32, Vec<Vec<u32>>) {
        let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        (self.reads.iter().map(|r| b(r)).collect(), self.loss.to_bits(), self.grads.iter().map(|g| b(g)).collect())
    }

    /// Within `tol` (relative to max(1, |expected|)) of another outcome.
    pub fn assert_close(&self, expected: &Outcome, tol: f32, what: &str) {
        let close = |a: &[f32], e: &[f32]| {
            a.len() == e.len() && a.iter().zip(e).all(|(x, y)| (x - y).abs() <= tol * y.abs().max(1.0))
        };
        assert_eq!(self.reads.len(), expected.reads.len());
        for (a, e) in self.reads.iter().zip(&expected.reads) {
            assert!(close(a, e), "{what}: read {a:?} vs {e:?}");
        }
        assert!(close(&[self.loss], &[expected.loss]), "{what}: loss {} vs {}", self.loss, expected.loss);
        for (a, e) in self.grads.iter().zip(&expected.grads) {
            assert!(close(a, e), "{what}: gradient {a:?} vs {e:?}");
        }
    }
}

/// One random chain of `len` element-wise nodes over variables of shapes
/// that broadcast to `dims` (the full dims, the last axis, a scalar, and a
/// column for two axes), read every few nodes, then differentiated.
pub fn random_chain(device: &Device, seed: u64, dims: &[usize], len: usize) -> Outcome {
    let graph = Graph::new(device);
    let mut rng = Lcg(seed);
    let numel: usize = dims.iter().product();
    let mut shapes: Vec<Vec<usize>> = vec![dims.to_vec(), vec![dims[dims.len() - 1]], vec![]];
    if dims.len() == 2 {
        shapes.push(vec![dims[0], 1]);
    }
    let vars: Vec<Tensor<'_>> = shapes
        .iter()
        .map(|s| {
            let n: usize = s.iter().product();
            let data: Vec<f32> = (0..n).map(|_| rng.uniform() * 2.0).collect();
            graph.variable(&data, s).unwrap()
        })
        .collect();
    let mut pool: Vec<Tensor<'_>> = vars.clone();
    let mut reads = Vec::new();
    let mut last = vars[0];
    for step in 0..len {
        let a = pool[pool.len() - 1 - rng.below(pool.len().min(6))];
        let b = pool[pool.len() - 1 - rng.below(pool.len().min(6))];
        let c = rng.uniform();
        let t = match rng.below(16) {
            0 => a.tanh(),
            1 => a.exp().unwrap().mul(0.25),
            2 => a.sigmoid(),
            3 => a.neg(),
            4 => a.abs().unwrap().add(0.5).unwrap().log(),
            5 => a.sin(),
            6 => a.relu(),
            7 => a.erf(),
            8 => a.add(b),
            9 => a.sub(b),
            10 => a.mul(b),
            11 => a.div(b.abs().unwrap().add(1.0).unwrap()),
            12 => a.maximum(b),
            13 => a.minimum(c),
            14 => a.gt(b).unwrap().where_(a, b.mul(c).unwrap()),
            _ => a.mul(c).unwrap().add(c * 0.5),
        }
        .unwrap();
        // Keep values bounded so long chains stay finite.
        let t = t.tanh().unwrap();
        pool.push(t);
        last = t;
        if step % 7 == 3 {
            reads.push(t.to_vec_blocking::<f32>().unwrap());
        }
    }
    // The chain's end and every variable, broadcast to the full dims, into
    // the loss (so every variable gets a gradient).
    let full = vars.iter().fold(last, |acc, &v| acc.add(v).unwrap());
    assert_eq!(full.numel(), numel);
    let loss = full.mul(full).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    let grads = vars.iter().map(|v| v.grad().unwrap().to_vec_blocking::<f32>().unwrap()).collect();
    let loss = loss.item_blocking().unwrap() as f32;
    Outcome { reads, loss, grads }
}
