//! Runnable training programs: see `examples/` (`cargo run --release -p kiln-examples --example xor`).
//!
//! The examples of kiln's extension points keep their work in this library
//! (`checkpointing`, `custom_op`), so that the tests in `tests/` run the
//! same code, including with a deliberately wrong gradient that the checks
//! must catch.

pub mod checkpointing;
pub mod custom_op;

/// Read a yes/no switch from the environment ("1", "true", "yes" are on).
pub fn env_flag(name: &str) -> bool {
    matches!(std::env::var(name).as_deref().map(str::to_ascii_lowercase).as_deref(), Ok("1" | "true" | "yes"))
}
