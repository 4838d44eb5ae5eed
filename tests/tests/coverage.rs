//! The coverage matrix of OPS.md must be complete: every primitive has a
//! kernel on the CPU and on wgpu, and either a gradient rule that passes
//! first- and second-order finite-difference checks or a declared reason
//! why it is not differentiable.

mod common;

use kiln::coverage::{coverage, markdown, row_is_complete};
use kiln::{Device, Op};

#[test]
fn every_op_has_kernels_everywhere_and_a_checked_rule_or_a_reason() {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::vulkan_device("coverage"));
    let rows = pollster::block_on(coverage(&devices)).expect("coverage runs");
    assert_eq!(rows.len(), Op::kind_names().len(), "one row per primitive op");
    let names: Vec<String> = devices.iter().map(|d| d.name()).collect();
    let incomplete: Vec<&str> = rows.iter().filter(|r| !row_is_complete(r)).map(|r| r.name).collect();
    assert!(incomplete.is_empty(), "incomplete rows {incomplete:?}\n{}", markdown(&rows, &names));
    // The differentiable core of OPS.md really is differentiated and checked.
    for name in ["Exp", "MatMul", "Im2Col", "MaxPool2dBackward", "ScatterAdd", "SliceBackward", "Col2Im"] {
        let row = rows.iter().find(|r| r.name == name).expect("listed");
        assert!(row.rule.is_ok() && row.second_order.is_some(), "{name} must have a checked rule");
    }
}
