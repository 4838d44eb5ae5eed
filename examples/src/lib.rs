//! Runnable training programs: see `examples/` (`cargo run --release -p kiln-examples --example xor`).
