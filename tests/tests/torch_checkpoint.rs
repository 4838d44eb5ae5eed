//! A checkpoint written by PyTorch loads into kiln and computes what PyTorch
//! computed. tests/reference/make_torch_gpt.py builds a small GPT from
//! PyTorch's own modules (nn.Embedding, causal pre-norm
//! nn.TransformerEncoderLayer blocks, nn.LayerNorm, an nn.Linear head tied
//! to the token embedding), saves its state_dict with
//! `safetensors.torch.save_file` and records PyTorch's logits, loss and
//! gradients for one batch. Here the file goes into `kiln::gpt::Gpt` through
//! `checkpoint::load_state` and kiln's forward and backward are compared
//! with those records. The fixtures are committed, so no Python runs here.

use kiln::checkpoint;
use kiln::gpt::{self, Gpt, GptConfig};
use kiln::nn::Module;
use kiln::prelude::*;
use safetensors::SafeTensors;

mod common;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/reference/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A stored tensor's values (f32 or i32, little-endian) as f64.
fn values(file: &SafeTensors<'_>, key: &str) -> Vec<f64> {
    let t = file.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
    let words = t.data().chunks_exact(4).map(|b| [b[0], b[1], b[2], b[3]]);
    match t.dtype() {
        safetensors::Dtype::F32 => words.map(|w| f32::from_le_bytes(w) as f64).collect(),
        safetensors::Dtype::I32 => words.map(|w| i32::from_le_bytes(w) as f64).collect(),
        other => panic!("{key}: unexpected dtype {other:?}"),
    }
}

fn matches_pytorch(name: &str, bias: bool) {
    let device = Device::cpu();
    let config = GptConfig { vocab: 11, context: 8, layers: 2, heads: 2, width: 16, dropout: 0.0, bias };
    let model = Gpt::new(&device, config, 0).unwrap();
    let state = fixture(&format!("torch_gpt_{name}.safetensors"));
    // Every key of PyTorch's state_dict, the tied "head.weight" included.
    let keys = SafeTensors::deserialize(&state).unwrap().names().len();
    assert_eq!(keys, model.named_parameters().len() + 1, "the file holds the head's copy of the table too");
    checkpoint::load_state(&model, &state).unwrap();

    let expected_bytes = fixture(&format!("torch_gpt_{name}_expected.safetensors"));
    let expected = SafeTensors::deserialize(&expected_bytes).unwrap();
    let ids = |key: &str| values(&expected, key).into_iter().map(|v| v as i32).collect::<Vec<i32>>();
    let (tokens, targets) = (ids("tokens"), ids("targets"));
    let graph = Graph::new(&device);
    let x = graph.tensor_from(&tokens, &[3, 7]).unwrap();
    let y = graph.tensor_from(&targets, &[3, 7]).unwrap();
    let logits = model.forward(x).unwrap();
    assert_eq!(logits.dims().as_slice(), &[3, 7, 11]);
    common::assert_close(&common::values(&logits), &values(&expected, "logits"), 1e-5);

    let loss = gpt::lm_loss(&model, x, y).unwrap();
    common::assert_close(&common::values(&loss), &values(&expected, "loss"), 1e-5);
    loss.backward().unwrap();
    for (key, param) in model.named_parameters() {
        let grad = common::param_grad(&param);
        let torch = values(&expected, &format!("grad.{key}"));
        // Gradients are small sums of many products: compare against the
        // largest magnitude of each tensor, not element by element.
        let scale = torch.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-3);
        let worst = grad.iter().zip(&torch).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert_eq!(grad.len(), torch.len(), "{key}");
        assert!(worst <= 1e-4 * scale, "{name} {key}: largest difference {worst} (scale {scale})");
    }
}

/// nanoGPT's recipe (kiln's default): no biases in the blocks and norms.
#[test]
fn a_pytorch_gpt_without_biases_loads_and_matches() {
    matches_pytorch("nobias", false);
}

/// With biases: `in_proj_bias`, `out_proj.bias`, `linear*.bias`, `norm*.bias`.
#[test]
fn a_pytorch_gpt_with_biases_loads_and_matches() {
    matches_pytorch("bias", true);
}
