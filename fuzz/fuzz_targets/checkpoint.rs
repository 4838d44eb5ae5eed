//! Checkpoint parsing: `load_state`, `read_metadata` and
//! `load_optimizer_state` on arbitrary bytes (or edits of a valid checkpoint)
//! never panic, and a refused `load_state` leaves the model unchanged.
#![no_main]

mod seeded;

use std::cell::RefCell;

use kiln::checkpoint;
use kiln::prelude::*;
use libfuzzer_sys::fuzz_target;

struct State {
    model: Sequential,
    original: Vec<u8>,
    sgd: RefCell<Sgd>,
}

thread_local! {
    static STATE: State = {
        let model = Sequential::mlp(&Device::cpu(), &[3, 4, 2], Activation::Tanh, 0).unwrap();
        let original = pollster::block_on(checkpoint::save_state(&model)).unwrap();
        let sgd = RefCell::new(Sgd::new(model.parameters(), 0.1).unwrap());
        State { model, original, sgd }
    };
}

fuzz_target!(|data: &[u8]| {
    STATE.with(|s| {
        let bytes = seeded::input(&s.original, data);
        let loaded = checkpoint::load_state(&s.model, &bytes);
        let _ = checkpoint::read_metadata(&bytes);
        let _ = checkpoint::load_optimizer_state(&mut *s.sgd.borrow_mut(), &bytes);
        if loaded.is_err() {
            let after = pollster::block_on(checkpoint::save_state(&s.model)).unwrap();
            assert!(after == s.original, "a refused load changed the model");
        } else {
            // A valid edit: restore the original values for the next input.
            checkpoint::load_state(&s.model, &s.original).unwrap();
        }
    })
});
