//! The WGSL sources and their specialisations.
//!
//! Every `.wgsl` file in `shaders/` is one op family, valid WGSL as written
//! once `common.wgsl` (the shared declarations) is put in front of it. A
//! kernel is specialised by replacing whole declarations of its file: the
//! element-type aliases (`alias T = f32;`) and the small functions its
//! comment names (`fn op(v: T) -> T`, a reduction's `fold`...), never text
//! inside a declaration. A [`Kernel`] names one generated variant;
//! [`Kernel::source`] makes its WGSL and [`all_kernels`] lists every variant
//! the backend can generate (the naga tests validate the files as written
//! and each variant without a device). Parameters are named structs,
//! mirrored on the host by `crate::params`.

use kiln_core::op::{BinaryOp, CompareOp, CustomOp, Expr, Op, ReduceOp, UnaryOp};
use kiln_core::DType;

/// A shader file as the GPU gets it: its `//` comments and blank lines are
/// left out at compile time (`strip_comments`). The comments are more than
/// half of the WGSL text and the WGSL was a fifth of the browser package's
/// gzipped bytes; the files as written stay the documentation. Lines keep
/// their indentation, which `specialise` relies on (a function ends at a
/// `}` in column 0).
macro_rules! wgsl_file {
    ($path:literal) => {{
        const TEXT: &[u8] = include_str!($path).as_bytes();
        const BYTES: [u8; stripped_len(TEXT)] = strip_comments(TEXT);
        match std::str::from_utf8(&BYTES) {
            Ok(s) => s,
            Err(_) => panic!("a WGSL file is not UTF-8 once its comments are out"),
        }
    }};
}

pub const COMMON: &str = wgsl_file!("shaders/common.wgsl");
pub const SCALAR: &str = wgsl_file!("shaders/scalar.wgsl");
pub const FILL: &str = wgsl_file!("shaders/fill.wgsl");
pub const UNARY: &str = wgsl_file!("shaders/unary.wgsl");
pub const BINARY: &str = wgsl_file!("shaders/binary.wgsl");
pub const WHERE: &str = wgsl_file!("shaders/where.wgsl");
pub const CAST: &str = wgsl_file!("shaders/cast.wgsl");
pub const REDUCE: &str = wgsl_file!("shaders/reduce.wgsl");
pub const MATMUL_COMMON: &str = wgsl_file!("shaders/matmul_common.wgsl");
pub const MATMUL: &str = wgsl_file!("shaders/matmul.wgsl");
pub const MATMUL_VEC4: &str = wgsl_file!("shaders/matmul_vec4.wgsl");
pub const CHUNKS: &str = wgsl_file!("shaders/chunks.wgsl");
pub const MOVEMENT: &str = wgsl_file!("shaders/movement.wgsl");
pub const INDEX: &str = wgsl_file!("shaders/index.wgsl");
pub const UPDATE: &str = wgsl_file!("shaders/update.wgsl");
pub const WINDOW: &str = wgsl_file!("shaders/window.wgsl");
pub const WINDOW_FOLDED: &str = wgsl_file!("shaders/window_folded.wgsl");
pub const POOL: &str = wgsl_file!("shaders/pool.wgsl");
pub const RANDOM: &str = wgsl_file!("shaders/random.wgsl");
pub const ROWWISE: &str = wgsl_file!("shaders/rowwise.wgsl");
pub const NORM: &str = wgsl_file!("shaders/norm.wgsl");
pub const TRIG: &str = wgsl_file!("shaders/trig.wgsl");
pub const STRIDED: &str = wgsl_file!("shaders/strided.wgsl");
pub const SCAN: &str = wgsl_file!("shaders/scan.wgsl");
pub const SELECT: &str = wgsl_file!("shaders/select.wgsl");

/// Every shader file by name, for the naga test and for readers.
pub const FILES: [(&str, &str); 25] = [
    ("common.wgsl", COMMON),
    ("scalar.wgsl", SCALAR),
    ("fill.wgsl", FILL),
    ("unary.wgsl", UNARY),
    ("binary.wgsl", BINARY),
    ("where.wgsl", WHERE),
    ("cast.wgsl", CAST),
    ("reduce.wgsl", REDUCE),
    ("matmul_common.wgsl", MATMUL_COMMON),
    ("matmul.wgsl", MATMUL),
    ("matmul_vec4.wgsl", MATMUL_VEC4),
    ("chunks.wgsl", CHUNKS),
    ("movement.wgsl", MOVEMENT),
    ("index.wgsl", INDEX),
    ("update.wgsl", UPDATE),
    ("window.wgsl", WINDOW),
    ("window_folded.wgsl", WINDOW_FOLDED),
    ("pool.wgsl", POOL),
    ("random.wgsl", RANDOM),
    ("rowwise.wgsl", ROWWISE),
    ("norm.wgsl", NORM),
    ("trig.wgsl", TRIG),
    ("strided.wgsl", STRIDED),
    ("scan.wgsl", SCAN),
    ("select.wgsl", SELECT),
];

/// Workgroup size of every one-dimensional kernel (`WG` in common.wgsl).
pub const WG: u32 = 256;
/// Highest rank the strided kernels take after the host has collapsed
/// contiguous and unit axes (`MAX_DIMS` in common.wgsl).
pub const MAX_DIMS: usize = 8;

/// How an element is stored on the GPU: bools are 0/1 `u32` words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    F32,
    I32,
    U32,
}

impl Ty {
    /// The storage type of a dtype; f64 has none (WGSL has no f64).
    pub fn of(dtype: DType) -> Option<Ty> {
        match dtype {
            DType::F32 => Some(Ty::F32),
            DType::I32 => Some(Ty::I32),
            DType::Bool => Some(Ty::U32),
            DType::F64 => None,
        }
    }
    pub fn wgsl(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::I32 => "i32",
            Ty::U32 => "u32",
        }
    }
    const ALL: [Ty; 3] = [Ty::F32, Ty::I32, Ty::U32];
}

/// One generated shader module. Entry points are chosen at pipeline creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Full and Arange into the given type.
    Fill(Ty),
    Unary(UnaryOp, Ty),
    Binary(BinaryOp, Ty),
    /// Comparison of two operands of the given type (bool output).
    Compare(CompareOp, Ty),
    Where(Ty),
    /// From, to.
    Cast(Ty, Ty),
    /// The reduction of the given input type.
    Reduce(ReduceOp, Ty),
    MatMul,
    /// matmul_vec4.wgsl with the generated entry point for A and B read
    /// transposed or not.
    MatMulVec4 {
        ta: bool,
        tb: bool,
        /// 16 output rows per thread instead of 8 (`MatMulKernel::Vec4Tall`).
        tall: bool,
    },
    /// matmul_vec4.wgsl's bindings with the staged, double-buffered
    /// 128 x 128 tile entry point (kernels/matmul_staged.rs; native only).
    #[cfg(not(target_arch = "wasm32"))]
    MatMulStaged {
        ta: bool,
        tb: bool,
    },
    /// chunks.wgsl: the chunk products of a long MatMul summed.
    Chunks,
    /// The strided word copy (movement.wgsl).
    Copy,
    /// index.wgsl with the given element type.
    Index(Ty),
    /// update.wgsl; `vec4`: four elements per thread (tensors of a
    /// multiple of 4 elements).
    Update {
        vec4: bool,
    },
    /// window.wgsl (Im2Col, Col2Im) with the given element type (f32, i32).
    Window(Ty),
    /// window_folded.wgsl: Im2Col and Col2Im with the batch folded into the
    /// columns.
    WindowFolded(Ty),
    /// pool.wgsl (MaxPool2d and its adjoint, f32).
    Pool,
    /// random.wgsl (RandUniform, RandNormal, f32).
    Random,
    /// rowwise.wgsl (CausalSoftmax, f32).
    Rowwise,
    /// scan.wgsl (CumSum) with the given element type (f32, i32).
    Scan(Ty),
    /// select.wgsl (TopK) with the given element type (f32, i32).
    Select(Ty),
    /// norm.wgsl (LayerNorm and its backward, f32; native only: the
    /// browser build composes layer norm).
    #[cfg(not(target_arch = "wasm32"))]
    Norm,
    /// A custom op's own kernel (validated when the op was registered).
    Custom(CustomOp),
    /// A generated kernel of `ops` fused element-wise ops (kernels/fused.rs
    /// makes and caches its pipeline; this names it in the profile).
    Fused {
        ops: u32,
    },
    /// A matrix product whose stores apply a fused group's `ops`
    /// (kernels/fused/head.rs; the matmul kernel it was generated from).
    FusedMatMul {
        kernel: crate::kernels::matmul_tune::MatMulKernel,
        ops: u32,
    },
    /// A reduction whose elements are computed by a fused group's `ops`
    /// (kernels/fused/tail.rs; native only).
    #[cfg(not(target_arch = "wasm32"))]
    FusedReduce {
        op: ReduceOp,
        ops: u32,
    },
}

impl Kernel {
    /// Entry points of the module (pipelines are made per entry point).
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Kernel::Reduce(..) => &[
                "serial",
                "serial_leaves",
                "leaf_groups",
                "serial_parts",
                "leaves_to_parts",
                "leaves_to_out",
                "parts_to_parts",
                "parts_to_out",
            ],
            Kernel::Index(_) => &[
                "check",
                "check_value",
                "gather",
                "sort_init",
                "sort_step",
                "buckets_clear",
                "buckets_find",
                "leaves",
                "tree_level",
                "scatter",
            ],
            Kernel::Update { .. } => &["sgd", "sgd_momentum", "adam"],
            Kernel::Window(_) => &["im2col", "col2im"],
            Kernel::WindowFolded(_) => &["im2col", "im2col8", "col2im"],
            Kernel::Pool => &["forward", "first_maxima", "backward", "backward8"],
            Kernel::Chunks => &["combine", "accumulate"],
            Kernel::Random => &["uniform", "normal"],
            Kernel::Rowwise => &["serial", "max_leaves", "max_parts", "sum_leaves", "sum_parts", "normalise"],
            #[cfg(not(target_arch = "wasm32"))]
            Kernel::Norm => &["forward_serial", "backward_serial", "forward_rows", "backward_rows"],
            Kernel::MatMul => &["tile128", "tile64", "skinny"],
            // strided.wgsl's two launches.
            Kernel::Binary(..) | Kernel::Compare(..) | Kernel::Where(_) | Kernel::Copy => &["main", "main8"],
            _ => &["main"],
        }
    }

    /// A short stable name for labels and error messages.
    pub fn label(self) -> String {
        format!("{self:?}")
    }

    /// The complete WGSL of this variant, or None when the combination does
    /// not exist (an op the type does not support).
    pub fn source(self) -> Option<String> {
        if let Kernel::Custom(op) = self {
            // The user's WGSL with kiln's custom-op prelude, not common.wgsl.
            return op.wgsl().map(|k| k.source.clone());
        }
        let body = match self {
            Kernel::Fill(t) => {
                let (from_f32, from_i32) = match t {
                    Ty::F32 => ("v", "f32(v)"),
                    Ty::I32 => ("f32_to_i32(v)", "v"),
                    Ty::U32 => ("f32_to_bool(v)", "i32_to_bool(v)"),
                };
                specialise(
                    FILL,
                    &[
                        alias("T", t),
                        format!("fn from_f32(v: f32) -> T {{\n    return {from_f32};\n}}"),
                        format!("fn from_i32(v: i32) -> T {{\n    return {from_i32};\n}}"),
                    ],
                )
            }
            Kernel::Unary(op, t) => {
                let expr = unary_expr(op, t)?;
                let body = specialise(UNARY, &[alias("T", t), format!("fn op(v: T) -> T {{\n    return {expr};\n}}")]);
                format!("{TRIG}\n{SCALAR}\n{body}")
            }
            Kernel::Binary(op, t) => binary(t, t, &binary_expr(op, t)?),
            Kernel::Compare(op, t) => binary(t, Ty::U32, &compare_expr(op, t)),
            Kernel::Where(t) => format!("{STRIDED}\n{}", specialise(WHERE, &[alias("T", t)])),
            Kernel::Cast(from, to) => specialise(
                CAST,
                &[
                    alias("TI", from),
                    alias("TO", to),
                    format!("fn convert(v: TI) -> TO {{\n    return {}(v);\n}}", cast_fn(from, to)),
                ],
            ),
            Kernel::Reduce(op, t) => reduce(op, t)?,
            Kernel::MatMul => format!("{MATMUL_COMMON}\n{MATMUL}"),
            Kernel::MatMulVec4 { ta, tb, tall } => {
                format!("{MATMUL_COMMON}\n{MATMUL_VEC4}\n{}", crate::kernels::matmul_vec4::entry(ta, tb, tall))
            }
            #[cfg(not(target_arch = "wasm32"))]
            Kernel::MatMulStaged { ta, tb } => {
                format!("{MATMUL_COMMON}\n{MATMUL_VEC4}\n{}", crate::kernels::matmul_staged::entry(ta, tb))
            }
            Kernel::Chunks => CHUNKS.to_string(),
            Kernel::Copy => format!("{STRIDED}\n{MOVEMENT}"),
            Kernel::Index(t) => specialise(INDEX, &[alias("T", t)]),
            Kernel::Update { vec4: false } => UPDATE.to_string(),
            Kernel::Update { vec4: true } => specialise(UPDATE, &["alias V = vec4<f32>;".to_string()]),
            Kernel::Window(Ty::U32) => return None, // the CPU has no bool Im2Col either
            Kernel::Window(t) => specialise(WINDOW, &[alias("T", t)]),
            Kernel::WindowFolded(Ty::U32) => return None,
            Kernel::WindowFolded(t) => specialise(WINDOW_FOLDED, &[alias("T", t)]),
            Kernel::Pool => POOL.to_string(),
            Kernel::Random => RANDOM.to_string(),
            Kernel::Rowwise => ROWWISE.to_string(),
            Kernel::Scan(Ty::U32) => return None, // no bool CumSum (nor on the CPU)
            Kernel::Scan(t) => specialise(SCAN, &[alias("T", t)]),
            Kernel::Select(Ty::U32) => return None, // no bool TopK (nor on the CPU)
            Kernel::Select(Ty::I32) => {
                specialise(SELECT, &[alias("T", Ty::I32), "fn nan(v: T) -> bool {\n    return false;\n}".to_string()])
            }
            Kernel::Select(t) => specialise(SELECT, &[alias("T", t)]),
            #[cfg(not(target_arch = "wasm32"))]
            Kernel::Norm => NORM.to_string(),
            Kernel::Custom(_) => unreachable!("handled above"),
            Kernel::Fused { .. } | Kernel::FusedMatMul { .. } => return None,
            #[cfg(not(target_arch = "wasm32"))]
            Kernel::FusedReduce { .. } => return None,
        };
        Some(format!("{COMMON}\n{body}"))
    }
}

/// `alias NAME = <t>;`.
fn alias(name: &str, t: Ty) -> String {
    format!("alias {name} = {};", t.wgsl())
}

/// trig.wgsl, scalar.wgsl, strided.wgsl and binary.wgsl with operand type `ti`, output
/// type `to` and `op` returning `expr` (of `a` and `b`).
fn binary(ti: Ty, to: Ty, expr: &str) -> String {
    let body = specialise(
        BINARY,
        &[alias("TI", ti), alias("TO", to), format!("fn op(a: TI, b: TI) -> TO {{\n    return {expr};\n}}")],
    );
    format!("{TRIG}\n{SCALAR}\n{STRIDED}\n{body}")
}

/// The name and kind of a module-scope declaration: `alias NAME` or `fn NAME`.
fn declared(decl: &str) -> Option<(&'static str, &str)> {
    let (kind, rest) = if let Some(r) = decl.strip_prefix("alias ") {
        ("alias", r)
    } else if let Some(r) = decl.strip_prefix("fn ") {
        ("fn", r)
    } else {
        return None;
    };
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
    Some((kind, &rest[..end]))
}

/// `file` with each of `decls` in place of the file's declaration of the same
/// kind and name (an alias: its line; a function: from its `fn` line to its
/// closing `}` line). Declarations start at the beginning of a line, as the
/// files are written. Panics when the file has no such declaration: the
/// variant test generates every kernel, so that is caught by `cargo test`.
pub fn specialise(file: &str, decls: &[String]) -> String {
    let mut lines: Vec<&str> = file.lines().collect();
    let mut replaced: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    for decl in decls {
        let (kind, name) = declared(decl).unwrap_or_else(|| panic!("not a declaration: {decl}"));
        let start = lines
            .iter()
            .position(|l| declared(l) == Some((kind, name)))
            .unwrap_or_else(|| panic!("the shader has no `{kind} {name}` to specialise"));
        let end = if kind == "alias" {
            start
        } else {
            start
                + lines[start..]
                    .iter()
                    .position(|l| *l == "}")
                    .unwrap_or_else(|| panic!("`fn {name}` has no closing line"))
        };
        replaced.splice(start..=end, [decl.clone()]);
        lines.splice(start..=end, [""]);
    }
    let mut s = replaced.join("\n");
    s.push('\n');
    s
}

/// The dtype whose storage type `t` is (u32 words hold bools).
fn dtype_of(t: Ty) -> DType {
    match t {
        Ty::F32 => DType::F32,
        Ty::I32 => DType::I32,
        Ty::U32 => DType::Bool,
    }
}

/// The op table's expression of element-wise `op` printed as WGSL over the
/// operands `args` of type `t`, when the table has a kernel for `t`.
fn table_expr(op: Op, t: Ty, args: &[&str]) -> Option<String> {
    let info = op.info();
    let e = info.elementwise?;
    info.dtypes.contains(dtype_of(t)).then(|| wgsl_expr(&e.expr, t, args))
}

/// The WGSL that computes a unary op of `v` (None: the table has no kernel
/// for the type).
pub fn unary_expr(op: UnaryOp, t: Ty) -> Option<String> {
    table_expr(Op::Unary(op), t, &["v"])
}

/// The WGSL that computes a binary op of `a` and `b`.
pub fn binary_expr(op: BinaryOp, t: Ty) -> Option<String> {
    table_expr(Op::Binary(op), t, &["a", "b"])
}

/// The WGSL (a u32 0 or 1) of a comparison of `a` and `b` of type `t`.
pub fn compare_expr(op: CompareOp, t: Ty) -> String {
    compare_expr_of(op, t, &["a", "b"])
}

/// `compare_expr` of the operands named `args`.
pub fn compare_expr_of(op: CompareOp, t: Ty, args: &[&str]) -> String {
    let e = Op::Compare(op).info().elementwise.expect("comparisons are element-wise").expr;
    format!("select(0u, 1u, {})", wgsl_cond(&e, t, args))
}

/// The WGSL of a unary or binary op of the operands named `args`, as its
/// own kernel computes it (None: no kernel for the type).
pub fn op_expr(op: Op, t: Ty, args: &[&str]) -> Option<String> {
    table_expr(op, t, args)
}

/// An expression of the op table (`op::Expr`) as WGSL of type `t`: each
/// primitive is scalar.wgsl's function `<op>_<type>` (the op's table name in
/// lower case), so printing needs no per-op code here.
pub fn wgsl_expr(e: &Expr, t: Ty, args: &[&str]) -> String {
    let ty = t.wgsl();
    match *e {
        Expr::Arg(k) => args[k as usize].to_string(),
        Expr::Const(c) => constant(c, t),
        Expr::Unary(op, a) => format!("{}_{ty}({})", op.name().to_ascii_lowercase(), wgsl_expr(a, t, args)),
        Expr::Binary(op, a, b) => {
            format!("{}_{ty}({}, {})", op.name().to_ascii_lowercase(), wgsl_expr(a, t, args), wgsl_expr(b, t, args))
        }
        // A bool used as a number: 0 or 1 (as `Value::from_bool`).
        Expr::Compare(..) => format!("select({}, {}, {})", constant(0.0, t), constant(1.0, t), wgsl_cond(e, t, args)),
        Expr::Select(c, a, b) => {
            format!("select({}, {}, {})", wgsl_expr(b, t, args), wgsl_expr(a, t, args), wgsl_cond(c, t, args))
        }
        // One element type in and out (as `Expr::eval`): nothing to convert.
        Expr::Cast(a) => wgsl_expr(a, t, args),
    }
}

/// A WGSL `bool` of an expression: a comparison, or a number != 0.
fn wgsl_cond(e: &Expr, t: Ty, args: &[&str]) -> String {
    match *e {
        Expr::Compare(op, a, b) => {
            let (a, b) = (wgsl_expr(a, t, args), wgsl_expr(b, t, args));
            match op {
                CompareOp::Equal => format!("({a} == {b})"),
                // True for NaN, as IEEE (and the CPU) say.
                CompareOp::NotEqual => format!("!({a} == {b})"),
                CompareOp::Less => format!("({a} < {b})"),
                CompareOp::LessEqual => format!("({a} <= {b})"),
                CompareOp::Greater => format!("({a} > {b})"),
                CompareOp::GreaterEqual => format!("({a} >= {b})"),
            }
        }
        _ => format!("({} != {})", wgsl_expr(e, t, args), constant(0.0, t)),
    }
}

/// A finite constant of the table as a WGSL value of type `t`. Non-finite
/// constants are refused: WGSL compilers reject constant expressions that
/// evaluate to inf or NaN (the variant test prints every table expression,
/// so a table entry with one fails there, not on a device).
fn constant(c: f64, t: Ty) -> String {
    match t {
        Ty::F32 => {
            let v = c as f32;
            assert!(v.is_finite(), "the op table's constant {c} is not a finite f32; WGSL cannot state it");
            format!("f32({v:?})")
        }
        Ty::I32 => format!("i32({})", c as i32),
        Ty::U32 => format!("u32({})", c as u32),
    }
}

pub fn cast_fn(from: Ty, to: Ty) -> &'static str {
    match (from, to) {
        (Ty::F32, Ty::F32) | (Ty::I32, Ty::I32) | (Ty::U32, Ty::U32) => "",
        (Ty::F32, Ty::I32) => "f32_to_i32",
        (Ty::F32, Ty::U32) => "f32_to_bool",
        (Ty::I32, Ty::U32) => "i32_to_bool",
        (_, Ty::F32) => "f32",
        (_, Ty::I32) => "i32",
    }
}

fn reduce(op: ReduceOp, t: Ty) -> Option<String> {
    let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    if !arg && t == Ty::U32 {
        return None; // Sum/Max/... of bools: the CPU refuses them too.
    }
    let nan = if t == Ty::F32 { "is_nan" } else { "never_nan" };
    let init = match op {
        ReduceOp::Sum => "Acc(T(0), 0u, 1u)",
        ReduceOp::Prod => "Acc(T(1), 0u, 1u)",
        _ => "Acc(T(0), 0u, 0u)",
    };
    // a is the earlier partial, b the later one (by position in the block
    // for `serial`; by lane for `tree`, where only the values matter except
    // for the arg reductions, which compare indices).
    let fold = match op {
        ReduceOp::Sum => "    return Acc(a.v + b.v, 0u, 1u);".to_string(),
        ReduceOp::Prod => "    return Acc(a.v * b.v, 0u, 1u);".to_string(),
        ReduceOp::Max | ReduceOp::Min => {
            let keep = if op == ReduceOp::Max { ">=" } else { "<=" };
            format!(
                "    if ({nan}(a.v)) {{\n        return a;\n    }}\n    if ({nan}(b.v)) {{\n        return b;\n    }}\n    \
                 if (a.v {keep} b.v) {{\n        return a;\n    }}\n    return b;"
            )
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            let better = if op == ReduceOp::ArgMax { ">" } else { "<" };
            format!(
                "    let an = {nan}(a.v);\n    let bn = {nan}(b.v);\n    \
                 if (an && bn) {{\n        return earlier(a, b);\n    }}\n    if (an) {{\n        return a;\n    }}\n    \
                 if (bn) {{\n        return b;\n    }}\n    if (a.v == b.v) {{\n        return earlier(a, b);\n    }}\n    \
                 if (a.v {better} b.v) {{\n        return a;\n    }}\n    return b;"
            )
        }
    };
    let (to, out) = if arg { (Ty::I32, "i32(acc.i)") } else { (t, "acc.v") };
    Some(specialise(
        REDUCE,
        &[
            alias("T", t),
            alias("TO", to),
            format!("fn init() -> Acc {{\n    return {init};\n}}"),
            format!("fn fold(a: Acc, b: Acc) -> Acc {{\n{fold}\n}}"),
            format!("fn result(acc: Acc) -> TO {{\n    return {out};\n}}"),
        ],
    ))
}

/// Every variant the backend can generate.
pub fn all_kernels() -> Vec<Kernel> {
    let mut v = vec![
        Kernel::MatMul,
        Kernel::Chunks,
        Kernel::Copy,
        Kernel::Update { vec4: false },
        Kernel::Update { vec4: true },
        Kernel::Pool,
        Kernel::Random,
        Kernel::Rowwise,
    ];
    #[cfg(not(target_arch = "wasm32"))]
    v.push(Kernel::Norm);
    #[cfg(not(target_arch = "wasm32"))]
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        v.push(Kernel::MatMulVec4 { ta, tb, tall: false });
        v.push(Kernel::MatMulVec4 { ta, tb, tall: true });
        v.push(Kernel::MatMulStaged { ta, tb });
    }
    for t in Ty::ALL {
        v.push(Kernel::Window(t));
        #[cfg(not(target_arch = "wasm32"))]
        v.push(Kernel::WindowFolded(t));
        v.push(Kernel::Fill(t));
        v.push(Kernel::Where(t));
        v.push(Kernel::Index(t));
        v.push(Kernel::Scan(t));
        v.push(Kernel::Select(t));
        for to in Ty::ALL {
            v.push(Kernel::Cast(t, to));
        }
        for op in UnaryOp::ALL {
            v.push(Kernel::Unary(op, t));
        }
        for op in BinaryOp::ALL {
            v.push(Kernel::Binary(op, t));
        }
        for op in CompareOp::ALL {
            v.push(Kernel::Compare(op, t));
        }
        for op in ReduceOp::ALL {
            v.push(Kernel::Reduce(op, t));
        }
    }
    v.retain(|k| k.source().is_some());
    v
}

/// A shader file as the host compiles it before specialisation (what the
/// naga tests validate): after common.wgsl, for the element-wise kernels
/// after trig.wgsl and scalar.wgsl too, and for the strided kernels after
/// strided.wgsl.
#[cfg(test)]
pub(crate) fn as_written(name: &str, text: &str) -> String {
    match name {
        "common.wgsl" => COMMON.to_string(),
        // scalar.wgsl's sin_f32/cos_f32 call trig.wgsl's kiln_sin/kiln_cos.
        "scalar.wgsl" => format!("{COMMON}\n{TRIG}\n{SCALAR}"),
        "unary.wgsl" => format!("{COMMON}\n{TRIG}\n{SCALAR}\n{text}"),
        "binary.wgsl" => format!("{COMMON}\n{TRIG}\n{SCALAR}\n{STRIDED}\n{text}"),
        "where.wgsl" | "movement.wgsl" => format!("{COMMON}\n{STRIDED}\n{text}"),
        // Its entry points call the kernel's `element`: a stand-in here.
        "strided.wgsl" => format!("{COMMON}\n{text}\nfn element(i: u32, o: vec4<u32>) {{}}"),
        "matmul.wgsl" | "matmul_vec4.wgsl" => format!("{COMMON}\n{MATMUL_COMMON}\n{text}"),
        _ => format!("{COMMON}\n{text}"),
    }
}

/// The lines of `text` (each ending in `\n`) without `//` comments,
/// trailing blanks and lines that hold nothing else, and with an indented
/// line's indentation cut to one space (the download carries the WGSL:
/// about 6 KB raw, 0.3 KB gzipped; a line at module scope keeps column 0,
/// which `specialise` relies on), written into `out` when it is given;
/// returns the length. WGSL has no string literals, so every `//` starts a
/// comment. Only ASCII bytes are cut, so UTF-8 stays valid.
const fn strip_into(text: &[u8], mut out: Option<&mut [u8]>) -> usize {
    let mut len = 0;
    let mut start = 0;
    while start < text.len() {
        let mut end = start;
        while end < text.len() && text[end] != b'\n' {
            end += 1;
        }
        // Code ends at the first `//`, then drop trailing blanks.
        let mut code_end = start;
        while code_end < end && !(text[code_end] == b'/' && code_end + 1 < end && text[code_end + 1] == b'/') {
            code_end += 1;
        }
        while code_end > start && matches!(text[code_end - 1], b' ' | b'\t' | b'\r') {
            code_end -= 1;
        }
        let mut blank = true;
        let mut i = start;
        while i < code_end {
            blank &= matches!(text[i], b' ' | b'\t');
            i += 1;
        }
        if !blank {
            let mut i = start;
            while matches!(text[i], b' ' | b'\t') {
                i += 1;
            }
            if i > start {
                if let Some(o) = &mut out {
                    o[len] = b' ';
                }
                len += 1;
            }
            while i < code_end {
                if let Some(o) = &mut out {
                    o[len] = text[i];
                }
                len += 1;
                i += 1;
            }
            if let Some(o) = &mut out {
                o[len] = b'\n';
            }
            len += 1;
        }
        start = end + 1;
    }
    len
}

/// Bytes `strip_comments` keeps of `text`.
const fn stripped_len(text: &[u8]) -> usize {
    strip_into(text, None)
}

/// `text` without its comments (see `strip_into`); `N` is `stripped_len(text)`.
const fn strip_comments<const N: usize>(text: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    strip_into(text, Some(&mut out));
    out
}

/// Panics unless `src` parses and validates with naga, as wgpu checks a
/// module before creating its pipeline (the tests of every WGSL kiln writes
/// or generates).
#[cfg(test)]
pub(crate) fn validate_wgsl(name: &str, src: &str) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{name} does not parse:\n{}\n{src}", e.emit_to_string(src)));
    let mut validator =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty());
    if let Err(e) = validator.validate(&module) {
        panic!("{name} does not validate:\n{}\n{src}", e.emit_to_string(src));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backend's `supports` (the shared `has_kernel` table) names exactly
    /// the unary and binary ops that have a WGSL expression here.
    #[test]
    fn expressions_match_the_kernel_table() {
        use kiln_core::backend::checks::has_kernel;
        use kiln_core::op::Op;
        let stored = [DType::F32, DType::I32, DType::Bool];
        for dtype in stored {
            let t = Ty::of(dtype).unwrap();
            for u in UnaryOp::ALL {
                assert_eq!(has_kernel(&Op::Unary(u), dtype, &stored), unary_expr(u, t).is_some(), "{u:?} {dtype}");
            }
            for b in BinaryOp::ALL {
                assert_eq!(has_kernel(&Op::Binary(b), dtype, &stored), binary_expr(b, t).is_some(), "{b:?} {dtype}");
            }
        }
    }

    use super::validate_wgsl as validate;

    /// The files exactly as they are on disk (after common.wgsl, which is
    /// also checked alone): no placeholders, nothing filled in.
    #[test]
    fn every_file_parses_and_validates_as_written() {
        validate("common.wgsl", COMMON);
        for (name, text) in FILES.iter().skip(1) {
            validate(name, &as_written(name, text));
        }
    }

    /// Every primitive's scalar function exists where the table says a
    /// kernel does, with the name the printer uses, and nothing else in
    /// scalar.wgsl looks like one that no op uses (a renamed op leaves no
    /// dead function behind).
    #[test]
    fn scalar_functions_follow_the_table() {
        let module = naga::front::wgsl::parse_str(&format!("{COMMON}\n{TRIG}\n{SCALAR}")).unwrap();
        let defined: Vec<String> = module.functions.iter().filter_map(|(_, f)| f.name.clone()).collect();
        let mut used = Vec::new();
        for t in [Ty::F32, Ty::I32] {
            for u in UnaryOp::ALL {
                if let Some(e) = unary_expr(u, t) {
                    used.push(format!("{}_{}", u.name().to_lowercase(), t.wgsl()));
                    let _ = e;
                }
            }
            for b in BinaryOp::ALL {
                if binary_expr(b, t).is_some() {
                    used.push(format!("{}_{}", b.name().to_lowercase(), t.wgsl()));
                }
            }
        }
        for f in &defined {
            let is_op = f.ends_with("_f32") || f.ends_with("_i32");
            let own = UnaryOp::ALL.iter().any(|u| f.starts_with(&format!("{}_", u.name().to_lowercase())))
                || BinaryOp::ALL.iter().any(|b| f.starts_with(&format!("{}_", b.name().to_lowercase())));
            if is_op && own {
                assert!(used.contains(f), "scalar.wgsl defines {f}, which no op table entry uses");
            }
        }
    }

    /// The printer composes primitives: an expression the table could hold
    /// for a composed op validates with no WGSL of its own.
    #[test]
    fn composed_expressions_print_as_valid_wgsl() {
        use kiln_core::op::expr::arg;
        const SOFT: Expr = Expr::Binary(
            BinaryOp::Div,
            arg(0),
            &Expr::Binary(BinaryOp::Add, &Expr::Const(1.0), &Expr::Unary(UnaryOp::Abs, arg(0))),
        );
        const PICK: Expr = Expr::Select(&Expr::Compare(CompareOp::Less, arg(0), &Expr::Const(0.5)), arg(0), arg(1));
        assert_eq!(wgsl_expr(&SOFT, Ty::F32, &["v"]), "div_f32(v, add_f32(f32(1.0), abs_f32(v)))");
        assert_eq!(wgsl_expr(&PICK, Ty::F32, &["a", "b"]), "select(b, a, (a < f32(0.5)))");
        let src = format!(
            "{COMMON}\n{TRIG}\n{SCALAR}\nfn f(v: f32) -> f32 {{\n    return {};\n}}\nfn g(a: f32, b: f32) -> f32 {{\n    return {};\n}}\n",
            wgsl_expr(&SOFT, Ty::F32, &["v"]),
            wgsl_expr(&PICK, Ty::F32, &["a", "b"])
        );
        validate("composed", &src);
    }

    #[test]
    fn every_generated_variant_parses_and_validates() {
        let kernels = all_kernels();
        // fill, where, index x 3 types; 9 casts; the unary and binary ops
        // the table gives an f32 or i32 kernel (every op with one must have
        // a variant); 18 compares; 6 + 6 + 2 reductions; matmul, chunks,
        // copy, update (scalar and vec4); window and folded window x 2
        // types (f32, i32);
        // scan and select x 2 types (f32, i32);
        // pool, random, rowwise, norm; the vec4 (8 and 16 rows a thread)
        // and staged matmuls' 4 operand layouts each.
        let table = |op: Op| [DType::F32, DType::I32].iter().filter(|&&d| op.info().dtypes.contains(d)).count();
        let elementwise: usize = UnaryOp::ALL.iter().map(|&u| table(Op::Unary(u))).sum::<usize>()
            + BinaryOp::ALL.iter().map(|&b| table(Op::Binary(b))).sum::<usize>();
        assert_eq!(
            kernels.len(),
            3 + 3 + 3 + 9 + elementwise + 18 + 14 + 5 + 2 + 2 + 2 + 2 + 4 + 4 + 4 + 4,
            "{kernels:?}"
        );
        for k in kernels {
            let src = k.source().expect("listed variants exist");
            validate(&k.label(), &src);
            let module = naga::front::wgsl::parse_str(&src).unwrap();
            for entry in k.entry_points() {
                assert!(module.entry_points.iter().any(|e| e.name == *entry), "{k:?} lacks entry point {entry}");
            }
        }
    }

    /// Every entry point of every variant runs WG threads per workgroup (the
    /// host's dispatch arithmetic assumes it; the vec4 matmul's 32, which its
    /// host grid counts in tiles of 8 x 4 threads), and no entry point takes a
    /// struct that mixes per-thread builtins into per-workgroup ones:
    /// browsers' WGSL compilers (Tint) then treat the whole struct as
    /// per-thread, and a kernel that branches on its workgroup number
    /// before a `workgroupBarrier` is refused as non-uniform (naga accepts
    /// it, so this checks the shape instead).
    #[test]
    fn every_entry_point_uses_the_one_workgroup_size() {
        for k in all_kernels() {
            let src = k.source().unwrap();
            let module = naga::front::wgsl::parse_str(&src).unwrap();
            for e in &module.entry_points {
                let [x, y, z] = e.workgroup_size;
                let want = if matches!(k, Kernel::MatMulVec4 { .. }) { 32 } else { WG };
                assert_eq!(x * y * z, want, "{k:?}::{} has workgroup size {x} x {y} x {z}", e.name);
                for arg in &e.function.arguments {
                    if let naga::TypeInner::Struct { members, .. } = &module.types[arg.ty].inner {
                        for m in members {
                            let uniform = matches!(
                                m.binding,
                                Some(naga::Binding::BuiltIn(naga::BuiltIn::WorkGroupId | naga::BuiltIn::NumWorkGroups))
                            );
                            assert!(uniform, "{k:?}::{}: struct input member {:?} is per-thread", e.name, m.name);
                        }
                    }
                }
            }
        }
        // The constant the files use is the host's.
        let module = naga::front::wgsl::parse_str(COMMON).unwrap();
        let wg = module.constants.iter().find(|(_, c)| c.name.as_deref() == Some("WG")).expect("WG in common.wgsl").1;
        match module.global_expressions[wg.init] {
            naga::Expression::Literal(naga::Literal::U32(v)) => assert_eq!(v, WG),
            ref e => panic!("WG is not a u32 literal: {e:?}"),
        }
    }

    /// Specialising replaces whole declarations and refuses unknown ones.
    #[test]
    fn specialise_replaces_whole_declarations() {
        let file =
            "alias T = f32;\n\nfn op(v: T) -> T {\n    return v;\n}\n\nfn op_two(v: T) -> T {\n    return v;\n}\n";
        let s = specialise(file, &[alias("T", Ty::I32), "fn op(v: T) -> T {\n    return -v;\n}".to_string()]);
        assert_eq!(
            s,
            "alias T = i32;\n\nfn op(v: T) -> T {\n    return -v;\n}\n\nfn op_two(v: T) -> T {\n    return v;\n}\n"
        );
        let missing = std::panic::catch_unwind(|| specialise(file, &["fn nope() {\n}".to_string()]));
        assert!(missing.is_err());
    }

    #[test]
    fn comments_and_blank_lines_are_left_out_at_compile_time() {
        const TEXT: &[u8] =
            b"// header\n\nalias T = f32; // why\n\nfn op(v: T) -> T {\n    // note\n    return v;   \n}\n// tail";
        const OUT: [u8; stripped_len(TEXT)] = strip_comments(TEXT);
        assert_eq!(std::str::from_utf8(&OUT).unwrap(), "alias T = f32;\nfn op(v: T) -> T {\n return v;\n}\n");
        // The files as built: no comment left, and every line of code of
        // the file as written is there, in order.
        let written = [
            ("common.wgsl", include_str!("shaders/common.wgsl")),
            ("reduce.wgsl", include_str!("shaders/reduce.wgsl")),
        ];
        for (name, text) in written {
            let built = FILES.iter().find(|(n, _)| *n == name).unwrap().1;
            assert!(!built.contains("//") && built.len() < text.len() * 3 / 4, "{name}");
            let code: Vec<String> = text
                .lines()
                .map(|l| l.split("//").next().unwrap().trim_end())
                .filter(|l| !l.trim().is_empty())
                .map(|l| if l.starts_with([' ', '\t']) { format!(" {}", l.trim_start()) } else { l.to_string() })
                .collect();
            assert_eq!(built.lines().collect::<Vec<_>>(), code, "{name}");
        }
    }

    /// No file reads parameters by number any more (`p[k]` words).
    #[test]
    fn no_numbered_parameter_words() {
        for (name, text) in FILES {
            for (i, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap();
                let numbered = ["p[", "pf("].iter().any(|word| {
                    code.match_indices(word)
                        .any(|(at, _)| !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
                });
                assert!(!numbered, "{name}:{}: {line}", i + 1);
            }
        }
    }

    #[test]
    fn f64_has_no_storage_type() {
        assert_eq!(Ty::of(DType::F64), None);
        assert_eq!(Ty::of(DType::Bool), Some(Ty::U32));
    }
}
