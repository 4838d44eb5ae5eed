//! Random op programs on the CPU backend: the interpreter of the proptest
//! property `random_graphs_on_the_cpu_never_panic` (tests/tests/program),
//! fed by libFuzzer. Any panic, abort or a graph left unusable is a finding.
#![no_main]

#[path = "../../tests/tests/program/mod.rs"]
mod program;

use kiln::prelude::*;
use libfuzzer_sys::fuzz_target;

thread_local! {
    static CPU: Device = Device::cpu();
}

fuzz_target!(|data: &[u8]| {
    CPU.with(|cpu| {
        let _ = program::run_program(cpu, data, program::Mode::Cpu);
    })
});
