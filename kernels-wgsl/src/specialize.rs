//! Shape specialisation (native only): a dispatch whose parameter words
//! (shapes, strides, window geometry, element counts) repeat gets a pipeline
//! of its own in which those words are WGSL constants instead of a storage
//! buffer read.
//!
//! Why: every kernel reads its geometry from `params` (binding 0) and
//! unravels indices with divisions by it. A driver cannot fold a division by
//! a value it only sees at run time, nor unroll a loop over `params.rank`;
//! a software adapter pays most: Mesa's lavapipe loads storage memory lane
//! by lane unless the address is a compile-time constant. Measured on
//! lavapipe: W2's MaxPool2dBackward over [64, 32, 26, 26] took 31.5 ms per
//! call reading its geometry and 11.5 ms with it as constants. A training
//! loop repeats the same shapes every step, so the extra pipelines are made
//! once (at the second sighting of a parameter set, so a word that changes
//! every step, such as a seed or a scheduled learning rate, never costs a
//! compilation) and reused.
//!
//! How: the kernel's WGSL is parsed with naga; the type of `params` gives
//! each word's place (struct members and array elements at their offsets),
//! from which a constant expression of that type is printed, and the
//! declaration `@group(0) @binding(0) var<storage, read> params: T;` becomes
//! `var<private> params: T = T(...);`. Loops over a parameter rank are
//! written out per axis (`unroll_rank_loops`), so that they fold too; the
//! rest of the text is unchanged, so the kernel computes exactly what it
//! computes from the buffer (integers are exact, floats are printed so that
//! they read back to the same bits). The specialised text is validated by
//! naga before a pipeline is made; any
//! refusal (a non-finite float, which WGSL cannot spell as a constant, a
//! runtime-sized array, a validation error) keeps the generic pipeline.
//!
//! Bounded: at most `MAX_PIPELINES` specialised pipelines and
//! `MAX_SIGHTINGS` remembered parameter sets (forgotten when full).
//! `WgpuOptions::specialize_shapes` / `KILN_WGPU_SPECIALIZE=0` turns it off.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use crate::pipelines::Pipeline;
use crate::shaders::Kernel;

/// Specialised pipelines kept at most (later parameter sets run generic).
const MAX_PIPELINES: usize = 2048;
/// Parameter sets remembered before they are specialised (cleared when full).
const MAX_SIGHTINGS: usize = 16384;
/// The declaration every kernel's parameters use.
const DECLARATION: &str = "@group(0) @binding(0) var<storage, read> params: ";

/// What a dispatch runs before specialisation: an entry point of one of
/// kiln's kernels, or a generated pipeline (identified by its address; the
/// entry keeps it alive, so the address cannot be reused meanwhile).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Origin {
    Kernel(Kernel, &'static str),
    Generated(usize),
}

enum State {
    /// Seen once, not specialised yet.
    Seen,
    Ready(Rc<Pipeline>),
    /// Could not be specialised; the generic pipeline runs.
    Refused,
}

struct Entry {
    origin: Origin,
    words: Box<[u32]>,
    state: State,
    /// The generic pipeline of a `Generated` origin, held so that its
    /// address stays unique while this entry exists.
    _generic: Option<Rc<Pipeline>>,
}

/// How to print a parameter value: text pieces and words in order.
#[derive(Debug)]
enum Piece {
    Text(String),
    Word { index: usize, kind: Kind },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    U32,
    I32,
    F32,
}

/// A kernel's text with the parameters' constant expression left open.
struct Template {
    source: String,
    /// Where the declaration of `params` stands in `source`.
    declaration: std::ops::Range<usize>,
    pieces: Vec<Piece>,
    /// Words the type holds.
    words: usize,
    type_name: String,
}

#[derive(Default)]
pub(crate) struct Specializer {
    entries: HashMap<u64, Vec<Entry>>,
    sightings: usize,
    templates: HashMap<Origin, Option<Rc<Template>>>,
    /// Specialised pipelines made, and parameter sets refused.
    pub made: usize,
    pub refused: usize,
}

/// What `Specializer::lookup` found.
pub(crate) enum Found {
    /// Run this specialised pipeline (it binds no parameters).
    Ready(Rc<Pipeline>),
    /// Make one from this text and hand it to `Specializer::finish`.
    Make(Pending),
    /// Run the generic pipeline.
    Generic,
}

/// A specialisation to make: its text, and where to file the pipeline.
pub(crate) struct Pending {
    pub source: String,
    k: u64,
    origin: Origin,
}

fn key(origin: &Origin, words: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    origin.hash(&mut h);
    words.hash(&mut h);
    h.finish()
}

impl Specializer {
    /// Whether `entry` of `kernel` may be specialised: never a user's
    /// kernel (its parameters are its own), the optimizer update (its
    /// step-dependent factors change every step) or the random kernels
    /// (their seed); nor the tiled matrix products, which ran 1.7-2x slower
    /// specialised on lavapipe (their K loop, unrolled to a constant count,
    /// outgrows the registers; the tuner also timed them generic). The
    /// skinny product (a thread per output, one accumulator) may: W2's
    /// conv1 forward on lavapipe, K = 9, ran 50 -> 20 ms per call; K = 676
    /// unchanged.
    pub fn eligible(kernel: Kernel, entry: &str) -> bool {
        if kernel == Kernel::MatMul && entry == "skinny" {
            return true;
        }
        !matches!(
            kernel,
            Kernel::Custom(_)
                | Kernel::Update { .. }
                | Kernel::Random
                | Kernel::MatMul
                | Kernel::MatMulVec4 { .. }
                | Kernel::MatMulStaged { .. }
                | Kernel::FusedMatMul { .. }
                | Kernel::Chunks
        )
    }

    /// The pipeline a dispatch of `kernel`'s `entry` (`generated`: of that
    /// generated pipeline) with `words` should run. `source` gives the
    /// generic text, asked for once per kernel entry or generated pipeline.
    pub fn lookup(
        &mut self,
        kernel: Kernel,
        entry: &'static str,
        generated: Option<&Rc<Pipeline>>,
        source: impl FnOnce() -> Option<String>,
        words: &[u32],
    ) -> Found {
        let origin = match generated {
            Some(p) => Origin::Generated(Rc::as_ptr(p) as usize),
            None => Origin::Kernel(kernel, entry),
        };
        let k = key(&origin, words);
        let found = self
            .entries
            .get_mut(&k)
            .and_then(|list| list.iter_mut().find(|e| e.origin == origin && *e.words == *words));
        let Some(entry) = found else {
            if self.sightings >= MAX_SIGHTINGS {
                // Keep what was made; forget what was only seen or refused,
                // and the templates. (A template is only ever looked up
                // while an entry of its origin holds the generic pipeline,
                // so a generated origin's address cannot be reused under
                // a stale template.)
                for list in self.entries.values_mut() {
                    list.retain(|e| matches!(e.state, State::Ready(_)));
                }
                self.entries.retain(|_, list| !list.is_empty());
                self.templates.clear();
                self.sightings = 0;
            }
            self.sightings += 1;
            self.entries.entry(k).or_default().push(Entry {
                origin,
                words: words.into(),
                state: State::Seen,
                _generic: generated.cloned(),
            });
            return Found::Generic;
        };
        match &entry.state {
            State::Ready(p) => return Found::Ready(p.clone()),
            State::Refused => return Found::Generic,
            State::Seen if self.made >= MAX_PIPELINES => return Found::Generic,
            State::Seen => {}
        }
        // Second sighting: the text, if the parameters can be constants.
        let template = self.templates.entry(origin).or_insert_with(|| source().and_then(template)).clone();
        match template.and_then(|t| render(&t, words)) {
            Some(source) => Found::Make(Pending { source, k, origin }),
            None => {
                self.settle(k, origin, words, None);
                Found::Generic
            }
        }
    }

    /// File what became of a `Found::Make`: its pipeline, or None when it
    /// could not be made (the generic one runs from now on).
    pub fn finish(&mut self, pending: Pending, words: &[u32], pipeline: Option<Rc<Pipeline>>) {
        self.settle(pending.k, pending.origin, words, pipeline);
    }

    fn settle(&mut self, k: u64, origin: Origin, words: &[u32], pipeline: Option<Rc<Pipeline>>) {
        let Some(e) = self
            .entries
            .get_mut(&k)
            .and_then(|list| list.iter_mut().find(|e| e.origin == origin && *e.words == *words))
        else {
            return;
        };
        e.state = match pipeline {
            Some(p) => {
                self.made += 1;
                State::Ready(p)
            }
            None => {
                self.refused += 1;
                State::Refused
            }
        };
    }
}

/// The template of `source`'s parameters, or None when it declares none
/// the way kiln's kernels do, or their type cannot be a constant.
fn template(source: String) -> Option<Rc<Template>> {
    let source = unroll_rank_loops(&source);
    let start = source.find(DECLARATION)?;
    let end = start + source[start..].find(';')? + 1;
    let module = naga::front::wgsl::parse_str(&source).ok()?;
    let (_, global) = module.global_variables.iter().find(|(_, g)| {
        g.binding.as_ref().is_some_and(|b| b.group == 0 && b.binding == 0) && g.name.as_deref() == Some("params")
    })?;
    let mut pieces = Vec::new();
    let mut words = 0;
    value(&module, global.ty, 0, &mut pieces, &mut words)?;
    let type_name = type_name(&module, global.ty)?;
    Some(Rc::new(Template { source, declaration: start..end, pieces, words, type_name }))
}

/// The header of the loops over a parameter rank that kiln's kernels (and
/// generated kernels) unravel indices with: `for (var d = <rank>; d > 0u;
/// d = d - 1u) {`, the body indexing axis `d - 1u`.
const RANK_LOOP: (&str, &str) = ("for (var d = ", "; d > 0u; d = d - 1u) {");

/// `source` with every loop over a parameter rank (`RANK_LOOP`) written out
/// as one block per axis, from MAX_DIMS - 1 down to 0, each
/// `if (<rank> > D) { body with d - 1u as D }`: the same statements in the
/// same order. Why: with the parameters constants, each block's indices and
/// divisors are constants a software adapter's compiler folds, while the
/// loop stays a loop indexing `params.dims[d - 1u]` dynamically (measured
/// natively, parameters specialised: a permute over [32, 64, 676] took 27 ns
/// per element with the loop and 7 with the blocks on SwiftShader; over
/// [12, 64, 4, 32], 12 -> 3-5 ns on lavapipe). Generic pipelines keep the
/// loop: unspecialised, the blocks were no faster. A loop whose body uses
/// `d` otherwise, or breaks or continues, is left as it is.
fn unroll_rank_loops(source: &str) -> String {
    let (open, close) = RANK_LOOP;
    let mut out = String::with_capacity(source.len() * 2);
    let mut rest = source;
    while let Some(at) = rest.find(open) {
        let after = &rest[at + open.len()..];
        let written = after.find(close).and_then(|r| {
            let rank = &after[..r];
            let body_start = r + close.len();
            let body_len = matching_brace(&after[body_start..])?;
            let body = &after[body_start..body_start + body_len];
            let simple = rank.starts_with("params.")
                && rank.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
                && !has_word(body, "break")
                && !has_word(body, "continue")
                && !has_word(&replace_word_expr(body, "d - 1u", "0u"), "d");
            simple.then(|| {
                let mut blocks = String::new();
                for axis in (0..crate::shaders::MAX_DIMS).rev() {
                    let _ = writeln!(
                        blocks,
                        "if ({rank} > {axis}u) {{{}}}",
                        replace_word_expr(body, "d - 1u", &format!("{axis}u"))
                    );
                }
                (blocks, body_start + body_len + 1)
            })
        });
        match written {
            Some((blocks, used)) => {
                out.push_str(&rest[..at]);
                out.push_str(&blocks);
                rest = &after[used..];
            }
            None => {
                out.push_str(&rest[..at + open.len()]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The length of `text` up to (not including) the `}` that closes the
/// block it starts inside of.
fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, b) in text.bytes().enumerate() {
        match b {
            b'{' => depth += 1,
            b'}' if depth == 0 => return Some(i),
            b'}' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The places where `expr` occurs in `text` not inside a longer identifier
/// (`padded - 1u` is not `d - 1u`).
fn whole_matches<'t>(text: &'t str, expr: &'t str) -> impl Iterator<Item = usize> + 't {
    let bytes = text.as_bytes();
    text.match_indices(expr).map(|(i, _)| i).filter(move |&i| {
        bytes[..i].last().is_none_or(|&b| !is_ident_byte(b))
            && bytes.get(i + expr.len()).is_none_or(|&b| !is_ident_byte(b))
    })
}

/// Whether `word` occurs in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    whole_matches(text, word).next().is_some()
}

/// `text` with each whole occurrence of `expr` replaced by `with`.
fn replace_word_expr(text: &str, expr: &str, with: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    // The matches do not overlap (`match_indices`), so each starts at or
    // after the end of the one before.
    for i in whole_matches(text, expr) {
        out.push_str(&text[last..i]);
        out.push_str(with);
        last = i + expr.len();
    }
    out.push_str(&text[last..]);
    out
}

/// WGSL's name for type `ty`.
fn type_name(module: &naga::Module, ty: naga::Handle<naga::Type>) -> Option<String> {
    use naga::TypeInner as T;
    let t = &module.types[ty];
    Some(match &t.inner {
        T::Scalar(s) => scalar_name(*s)?.to_string(),
        T::Vector { size, scalar } => format!("vec{}<{}>", *size as u8, scalar_name(*scalar)?),
        T::Array { base, size: naga::ArraySize::Constant(n), .. } => {
            format!("array<{}, {n}>", type_name(module, *base)?)
        }
        T::Struct { .. } => t.name.clone()?,
        _ => return None,
    })
}

fn scalar_name(s: naga::Scalar) -> Option<&'static str> {
    match (s.kind, s.width) {
        (naga::ScalarKind::Uint, 4) => Some("u32"),
        (naga::ScalarKind::Sint, 4) => Some("i32"),
        (naga::ScalarKind::Float, 4) => Some("f32"),
        _ => None,
    }
}

fn scalar_piece(s: naga::Scalar, offset: u32, words: &mut usize) -> Option<Piece> {
    let kind = match scalar_name(s)? {
        "u32" => Kind::U32,
        "i32" => Kind::I32,
        _ => Kind::F32,
    };
    if offset % 4 != 0 {
        return None;
    }
    let index = (offset / 4) as usize;
    *words = (*words).max(index + 1);
    Some(Piece::Word { index, kind })
}

/// Append the pieces of a value of type `ty` stored at byte `offset`.
fn value(
    module: &naga::Module,
    ty: naga::Handle<naga::Type>,
    offset: u32,
    pieces: &mut Vec<Piece>,
    words: &mut usize,
) -> Option<()> {
    use naga::TypeInner as T;
    let mut list =
        |pieces: &mut Vec<Piece>, open: String, parts: &mut dyn Iterator<Item = (naga::Handle<naga::Type>, u32)>| {
            pieces.push(Piece::Text(open + "("));
            for (i, (t, o)) in parts.enumerate() {
                if i > 0 {
                    pieces.push(Piece::Text(", ".into()));
                }
                value(module, t, o, pieces, words)?;
            }
            pieces.push(Piece::Text(")".into()));
            Some(())
        };
    match &module.types[ty].inner {
        T::Scalar(s) => pieces.push(scalar_piece(*s, offset, words)?),
        T::Vector { size, scalar } => {
            pieces.push(Piece::Text(format!("{}(", type_name(module, ty)?)));
            for i in 0..*size as u32 {
                if i > 0 {
                    pieces.push(Piece::Text(", ".into()));
                }
                pieces.push(scalar_piece(*scalar, offset + 4 * i, words)?);
            }
            pieces.push(Piece::Text(")".into()));
        }
        T::Array { base, size: naga::ArraySize::Constant(n), stride } => {
            let (base, stride) = (*base, *stride);
            list(pieces, type_name(module, ty)?, &mut (0..n.get()).map(|i| (base, offset + i * stride)))?;
        }
        T::Struct { members, .. } => {
            let parts: Vec<_> = members.iter().map(|m| (m.ty, offset + m.offset)).collect();
            list(pieces, type_name(module, ty)?, &mut parts.into_iter())?;
        }
        _ => return None,
    }
    Some(())
}

/// The specialised text for `words`, or None when a word cannot be
/// spelled as a constant (a non-finite float) or too few were given.
fn render(t: &Template, words: &[u32]) -> Option<String> {
    if words.len() < t.words {
        return None;
    }
    let mut expr = String::new();
    for piece in &t.pieces {
        match *piece {
            Piece::Text(ref s) => expr.push_str(s),
            Piece::Word { index, kind } => {
                let w = words[index];
                let _ = match kind {
                    Kind::U32 => write!(expr, "{w}u"),
                    Kind::I32 if w as i32 == i32::MIN => write!(expr, "(-2147483647i - 1i)"),
                    Kind::I32 => write!(expr, "{}i", w as i32),
                    Kind::F32 => {
                        let f = f32::from_bits(w);
                        if !f.is_finite() {
                            return None;
                        }
                        // Debug prints the shortest text that reads back to
                        // the same f32 (and keeps -0.0's sign).
                        write!(expr, "{f:?}f")
                    }
                };
            }
        }
    }
    let s = &t.source;
    Some(format!(
        "{}var<private> params: {} = {expr};{}",
        &s[..t.declaration.start],
        t.type_name,
        &s[t.declaration.end..]
    ))
}

/// Parse and validate a specialised text as wgpu would (kiln's kernels
/// validate; a failure here means the text must not be used).
pub(crate) fn validates(source: &str) -> bool {
    let Ok(module) = naga::front::wgsl::parse_str(source) else { return false };
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "struct Inner {\n    base: u32,\n    steps: array<i32, 2>,\n}\n\
        struct P {\n    n: u32,\n    inner: array<Inner, 2>,\n    scale: f32,\n    v: vec2<u32>,\n}\n\
        @group(0) @binding(0) var<storage, read> params: P;\n\
        @group(0) @binding(1) var<storage, read_write> out: array<f32>;\n\
        @compute @workgroup_size(1)\nfn main() {\n    out[params.inner[1].base] = params.scale;\n}\n";

    /// The initializer of `params` in a specialised text, as naga folded it:
    /// the scalars in order.
    fn scalars(text: &str) -> Vec<naga::Literal> {
        let module = naga::front::wgsl::parse_str(text).unwrap();
        let (_, g) = module.global_variables.iter().find(|(_, g)| g.name.as_deref() == Some("params")).unwrap();
        let mut out = Vec::new();
        fn walk(m: &naga::Module, e: naga::Handle<naga::Expression>, out: &mut Vec<naga::Literal>) {
            match &m.global_expressions[e] {
                naga::Expression::Literal(l) => out.push(*l),
                naga::Expression::Compose { components, .. } => components.iter().for_each(|&c| walk(m, c, out)),
                naga::Expression::ZeroValue(_) => panic!("a zero value where words were given"),
                other => panic!("not folded: {other:?}"),
            }
        }
        walk(&module, g.init.expect("params is initialised"), &mut out);
        out
    }

    #[test]
    fn every_word_lands_in_its_field_and_the_text_validates() {
        let t = template(SOURCE.to_string()).expect("a template");
        // n, inner[0] (base, steps[2]), inner[1], scale, v (8-aligned: word 8).
        let words = [7, 1, (-3i32) as u32, i32::MIN as u32, 2, 5, 6, 1.5f32.to_bits(), 9, 10];
        let text = render(&t, &words).expect("finite words render");
        assert!(validates(&text), "{text}");
        assert!(!text.contains("var<storage, read> params"));
        use naga::Literal::{F32, I32, U32};
        assert_eq!(
            scalars(&text),
            [U32(7), U32(1), I32(-3), I32(i32::MIN), U32(2), I32(5), I32(6), F32(1.5), U32(9), U32(10)]
        );
        assert!(render(&t, &words[..9]).is_none(), "too few words");
    }

    #[test]
    fn floats_read_back_to_their_bits_and_non_finite_ones_refuse() {
        let source = "struct P {\n    v: array<f32, 64>,\n}\n@group(0) @binding(0) var<storage, read> params: P;\n";
        let t = template(source.to_string()).unwrap();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut patterns = vec![0u32, 0x8000_0000, 1, 0x8000_0001, 0x007f_ffff, 0x0080_0000, 0x7f7f_ffff, 0xff7f_ffff];
        for _ in 0..2000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let w = state as u32;
            if f32::from_bits(w).is_finite() {
                patterns.push(w);
            }
        }
        for chunk in patterns.chunks(64) {
            let mut words = chunk.to_vec();
            words.resize(64, 0);
            let text = render(&t, &words).unwrap();
            let read: Vec<u32> = scalars(&text)
                .into_iter()
                .map(|l| match l {
                    naga::Literal::F32(f) => f.to_bits(),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(read, words);
        }
        for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            let mut words = vec![0u32; 64];
            words[3] = bad.to_bits();
            assert!(render(&t, &words).is_none(), "{bad} has no WGSL constant");
        }
    }

    #[test]
    fn parameters_that_cannot_be_constants_keep_the_generic_kernel() {
        let runtime = "@group(0) @binding(0) var<storage, read> params: array<u32>;\n";
        assert!(template(runtime.to_string()).is_none());
        assert!(template("fn f() {}\n".to_string()).is_none(), "no parameters");
    }

    #[test]
    fn a_parameter_set_is_specialised_at_its_second_sighting_only() {
        let mut s = Specializer::default();
        let kernel = Kernel::Pool;
        let source = || Some(SOURCE.to_string());
        let words = [1u32; 10];
        assert!(matches!(s.lookup(kernel, "backward", None, source, &words), Found::Generic));
        let Found::Make(pending) = s.lookup(kernel, "backward", None, source, &words) else {
            panic!("made at the second")
        };
        // Another entry point or other words are other parameter sets.
        assert!(matches!(s.lookup(kernel, "forward", None, source, &words), Found::Generic));
        assert!(matches!(s.lookup(kernel, "backward", None, source, &[2u32; 10]), Found::Generic));
        // A refusal sticks: the generic kernel runs and nothing is retried.
        s.finish(pending, &words, None);
        assert!(matches!(s.lookup(kernel, "backward", None, source, &words), Found::Generic));
        assert_eq!((s.made, s.refused), (0, 1));
        // A non-finite float is refused at render time.
        let mut inf = [0u32; 10];
        inf[7] = f32::INFINITY.to_bits();
        assert!(matches!(s.lookup(kernel, "forward", None, source, &inf), Found::Generic));
        assert!(matches!(s.lookup(kernel, "forward", None, source, &inf), Found::Generic));
        assert_eq!(s.refused, 2);
    }

    #[test]
    fn rank_loops_are_written_out_per_axis() {
        let src = "fn f(i: u32) -> u32 {\n    var rem = i;\n    var off = 0u;\n    \
                   for (var d = params.kept.rank; d > 0u; d = d - 1u) {\n        let n = params.kept.dims[d - 1u];\n        \
                   if (n > 0u) { off += (rem % n) * params.kept.strides[d - 1u]; }\n        rem = rem / n;\n    }\n    \
                   let padded = off + 1u;\n    return padded - 1u;\n}\n";
        let out = unroll_rank_loops(src);
        assert!(!out.contains("for ("), "{out}");
        for axis in 0..crate::shaders::MAX_DIMS {
            let block = format!(
                "if (params.kept.rank > {axis}u) {{\n        let n = params.kept.dims[{axis}u];\n        \
                 if (n > 0u) {{ off += (rem % n) * params.kept.strides[{axis}u]; }}\n        rem = rem / n;\n    }}"
            );
            assert!(out.contains(&block), "axis {axis}:\n{out}");
        }
        // Highest axis first, as the loop runs; the text after it unchanged
        // (`padded - 1u` is not `d - 1u`).
        assert!(out.find("dims[7u]").unwrap() < out.find("dims[0u]").unwrap());
        assert!(out.ends_with("    let padded = off + 1u;\n    return padded - 1u;\n}\n"), "{out}");
        // Loops using d otherwise, or breaking, stay loops.
        for body in ["let k = d;", "if (rem == 0u) { break; }", "continue;"] {
            let src = format!("for (var d = params.rank; d > 0u; d = d - 1u) {{ {body} }}");
            assert_eq!(unroll_rank_loops(&src), src);
        }
    }

    #[test]
    fn every_kernel_of_kiln_has_a_template() {
        for kernel in crate::shaders::all_kernels() {
            if !kernel.entry_points().iter().any(|entry| Specializer::eligible(kernel, entry)) {
                continue;
            }
            let source = kernel.source().expect("listed kernels have text");
            let t = template(source).unwrap_or_else(|| panic!("{kernel:?}: no template"));
            // Any finite words make a text that validates.
            let text = render(&t, &vec![1u32; t.words]).unwrap();
            assert!(validates(&text), "{kernel:?}: the specialised text does not validate");
            // No loop over a parameter rank is left to run.
            assert!(!text.contains(RANK_LOOP.0), "{kernel:?}: a rank loop stays a loop");
        }
    }

    #[test]
    fn a_full_memory_forgets_sightings_and_refusals() {
        let mut s = Specializer::default();
        let source = || Some(SOURCE.to_string());
        let mut inf = [0u32; 10];
        inf[7] = f32::INFINITY.to_bits();
        s.lookup(Kernel::Pool, "forward", None, source, &inf);
        s.lookup(Kernel::Pool, "forward", None, source, &inf);
        assert_eq!(s.refused, 1);
        for i in 0..MAX_SIGHTINGS as u32 {
            s.lookup(Kernel::Pool, "backward", None, source, &[i; 10]);
        }
        assert!(s.entries.values().map(Vec::len).sum::<usize>() <= MAX_SIGHTINGS);
        // Forgotten: seen once more, then refused again.
        assert!(matches!(s.lookup(Kernel::Pool, "forward", None, source, &inf), Found::Generic));
        assert_eq!(s.refused, 1);
        s.lookup(Kernel::Pool, "forward", None, source, &inf);
        assert_eq!(s.refused, 2);
    }
}
