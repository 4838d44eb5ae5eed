//! A naga-free reading of a custom op's WGSL kernel, for builds without
//! kiln-core's `wgsl` feature (the browser package).
//!
//! It reads what the contract is about, not WGSL's grammar or types: the
//! tokens and their bracket structure (an unclosed or stray bracket is
//! refused with its line and column), the module-scope declarations, the
//! entry point's attributes and which globals `main` reaches through the
//! functions it calls (by name: a local that shadows a global counts as a
//! use). A kernel it accepts may still be refused by the GPU's compiler
//! when it is first used; kiln-wgsl reports that with the compiler's
//! message.

use std::collections::{HashMap, HashSet};

use super::wgsl::{Entry, Global};
use crate::dtype::DType;

type Scan<T> = std::result::Result<T, String>;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Ident,
    Number,
    Punct,
}

#[derive(Clone, Copy, Debug)]
struct Token<'a> {
    text: &'a str,
    kind: Kind,
    line: usize,
    col: usize,
}

fn parse_error(line: usize, col: usize, what: impl std::fmt::Display) -> String {
    format!("does not parse:\nwgsl:{line}:{col}: {what}")
}

/// Split into tokens (comments dropped), with 1-based lines and columns.
fn tokens(src: &str) -> Scan<Vec<Token<'_>>> {
    let chars: Vec<(usize, char)> = src.char_indices().collect();
    let text = |from: usize, to: usize| {
        let start = chars[from].0;
        let end = chars.get(to).map_or(src.len(), |c| c.0);
        &src[start..end]
    };
    let mut out = Vec::new();
    let (mut i, mut line, mut col) = (0, 1, 1);
    // Advance over chars[i..to], keeping line and column.
    let advance = |i: &mut usize, to: usize, line: &mut usize, col: &mut usize| {
        while *i < to {
            if chars[*i].1 == '\n' {
                *line += 1;
                *col = 1;
            } else {
                *col += 1;
            }
            *i += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i].1;
        let next = chars.get(i + 1).map(|c| c.1);
        let end = if c.is_whitespace() {
            i + 1
        } else if c == '/' && next == Some('/') {
            (i..chars.len()).find(|&j| chars[j].1 == '\n').unwrap_or(chars.len())
        } else if c == '/' && next == Some('*') {
            // Block comments nest in WGSL.
            let (mut j, mut depth) = (i + 2, 1);
            while depth > 0 {
                match (chars.get(j).map(|c| c.1), chars.get(j + 1).map(|c| c.1)) {
                    (None, _) => return Err(parse_error(line, col, "this block comment is never closed")),
                    (Some('/'), Some('*')) => (depth, j) = (depth + 1, j + 2),
                    (Some('*'), Some('/')) => (depth, j) = (depth - 1, j + 2),
                    _ => j += 1,
                }
            }
            j
        } else {
            let (kind, end) = if c.is_alphabetic() || c == '_' {
                let end = (i..chars.len()).find(|&j| !(chars[j].1.is_alphanumeric() || chars[j].1 == '_'));
                (Kind::Ident, end.unwrap_or(chars.len()))
            } else if c.is_ascii_digit() || (c == '.' && next.is_some_and(|n| n.is_ascii_digit())) {
                let hex = c == '0' && matches!(next, Some('x' | 'X'));
                let exponent = if hex { ['p', 'P'] } else { ['e', 'E'] };
                let mut j = i + 1;
                while let Some(&(_, d)) = chars.get(j) {
                    let signed = matches!(d, '+' | '-') && exponent.contains(&chars[j - 1].1);
                    if !(d.is_alphanumeric() || d == '.' || d == '_' || signed) {
                        break;
                    }
                    j += 1;
                }
                (Kind::Number, j)
            } else if c == '-' && next == Some('>') {
                (Kind::Punct, i + 2)
            } else {
                (Kind::Punct, i + 1)
            };
            out.push(Token { text: text(i, end), kind, line, col });
            end
        };
        advance(&mut i, end, &mut line, &mut col);
    }
    Ok(out)
}

/// For each opening bracket, the index of its closing one.
fn match_brackets(toks: &[Token]) -> Scan<HashMap<usize, usize>> {
    let mut open: Vec<usize> = Vec::new();
    let mut pairs = HashMap::new();
    for (i, t) in toks.iter().enumerate() {
        let closer = match t.text {
            "(" | "[" | "{" => {
                open.push(i);
                continue;
            }
            ")" => "(",
            "]" => "[",
            "}" => "{",
            _ => continue,
        };
        match open.pop() {
            Some(o) if toks[o].text == closer => {
                pairs.insert(o, i);
            }
            Some(o) => {
                let o = toks[o];
                return Err(parse_error(
                    t.line,
                    t.col,
                    format!("`{}` does not close the `{}` opened at {}:{}", t.text, o.text, o.line, o.col),
                ));
            }
            None => return Err(parse_error(t.line, t.col, format!("`{}` closes nothing", t.text))),
        }
    }
    match open.pop() {
        Some(o) => Err(parse_error(toks[o].line, toks[o].col, format!("this `{}` is never closed", toks[o].text))),
        None => Ok(pairs),
    }
}

/// The module-scope items the contract needs.
#[derive(Default)]
struct Module<'a> {
    /// Functions: attributes and the identifiers of their parameters and body.
    functions: HashMap<&'a str, (Vec<Attribute<'a>>, Vec<&'a str>)>,
    /// `var`s with their attributes, address-space template and type.
    vars: Vec<Var<'a>>,
    /// Constants whose value is one number.
    consts: HashMap<&'a str, &'a str>,
}

struct Attribute<'a> {
    name: &'a str,
    args: Vec<Vec<Token<'a>>>,
}

struct Var<'a> {
    name: &'a str,
    attributes: Vec<Attribute<'a>>,
    template: Vec<&'a str>,
    ty: Vec<&'a str>,
}

struct Reader<'t, 'a> {
    toks: &'t [Token<'a>],
    pairs: HashMap<usize, usize>,
    at: usize,
}

impl<'t, 'a> Reader<'t, 'a> {
    fn peek(&self) -> Option<Token<'a>> {
        self.toks.get(self.at).copied()
    }

    fn unexpected(&self, wanted: &str) -> String {
        match self.peek() {
            Some(t) => parse_error(t.line, t.col, format!("expected {wanted}, found `{}`", t.text)),
            None => {
                let last = self.toks.last().map_or((1, 1), |t| (t.line, t.col));
                parse_error(last.0, last.1, format!("expected {wanted} after this, found the end"))
            }
        }
    }

    fn ident(&mut self, wanted: &str) -> Scan<&'a str> {
        match self.peek() {
            Some(t) if t.kind == Kind::Ident => {
                self.at += 1;
                Ok(t.text)
            }
            _ => Err(self.unexpected(wanted)),
        }
    }

    fn eat(&mut self, text: &str) -> bool {
        let hit = self.peek().is_some_and(|t| t.text == text);
        self.at += hit as usize;
        hit
    }

    /// The tokens of a bracketed group at the cursor (brackets excluded),
    /// leaving the cursor after it.
    fn group(&mut self, open: &str) -> Scan<&'t [Token<'a>]> {
        if self.peek().map(|t| t.text) != Some(open) {
            return Err(self.unexpected(&format!("`{open}`")));
        }
        let close = self.pairs[&self.at];
        let inner = &self.toks[self.at + 1..close];
        self.at = close + 1;
        Ok(inner)
    }

    /// Tokens up to the next `stop` outside brackets, leaving the cursor on it.
    fn until(&mut self, stops: &[&str]) -> Scan<Vec<Token<'a>>> {
        let mut out = Vec::new();
        loop {
            let Some(t) = self.peek() else { return Err(self.unexpected(&format!("`{}`", stops[0]))) };
            if stops.contains(&t.text) {
                return Ok(out);
            }
            if let Some(&close) = self.pairs.get(&self.at) {
                out.extend_from_slice(&self.toks[self.at..=close]);
                self.at = close + 1;
            } else {
                out.push(t);
                self.at += 1;
            }
        }
    }

    fn attributes(&mut self) -> Scan<Vec<Attribute<'a>>> {
        let mut out = Vec::new();
        while self.eat("@") {
            let name = self.ident("an attribute name")?;
            let mut args = Vec::new();
            if self.peek().is_some_and(|t| t.text == "(") {
                let inner = self.group("(")?;
                for arg in split_commas(inner) {
                    args.push(arg.to_vec());
                }
            }
            out.push(Attribute { name, args });
        }
        Ok(out)
    }
}

/// The comma-separated parts of a bracket's contents (nested brackets kept whole).
fn split_commas<'t, 'a>(toks: &'t [Token<'a>]) -> Vec<&'t [Token<'a>]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, t) in toks.iter().enumerate() {
        match t.text {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&toks[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < toks.len() {
        parts.push(&toks[start..]);
    }
    parts
}

fn read_module<'a>(toks: &[Token<'a>]) -> Scan<Module<'a>> {
    let pairs = match_brackets(toks)?;
    let mut r = Reader { toks, pairs, at: 0 };
    let mut m = Module::default();
    while r.peek().is_some() {
        let attributes = r.attributes()?;
        let keyword = r.ident("a declaration")?;
        match keyword {
            "fn" => {
                let name = r.ident("the function's name")?;
                let params = r.group("(")?;
                let ret = r.until(&["{"])?;
                let body = r.group("{")?;
                // Names, not members (`v.x` does not use a global `x`).
                let toks: Vec<Token> = params.iter().chain(&ret).chain(body).copied().collect();
                let idents = toks
                    .iter()
                    .enumerate()
                    .filter(|&(i, t)| t.kind == Kind::Ident && (i == 0 || toks[i - 1].text != "."))
                    .map(|(_, t)| t.text)
                    .collect();
                m.functions.insert(name, (attributes, idents));
            }
            "var" => {
                let template = if r.eat("<") {
                    let t = r.until(&[">"])?;
                    r.at += 1;
                    t.iter().filter(|t| t.kind == Kind::Ident).map(|t| t.text).collect()
                } else {
                    Vec::new()
                };
                let name = r.ident("the variable's name")?;
                let ty = if r.eat(":") { r.until(&["=", ";"])? } else { Vec::new() };
                r.until(&[";"])?;
                r.at += 1;
                let ty = ty.iter().filter(|t| t.text != "<" && t.text != ">").map(|t| t.text).collect();
                m.vars.push(Var { name, attributes, template, ty });
            }
            "const" | "override" => {
                let name = r.ident("the constant's name")?;
                let rest = r.until(&[";"])?;
                r.at += 1;
                if let [.., eq, value] = rest.as_slice() {
                    if eq.text == "=" && value.kind == Kind::Number {
                        m.consts.insert(name, value.text);
                    }
                }
            }
            "struct" => {
                r.ident("the struct's name")?;
                r.group("{")?;
                r.eat(";");
            }
            "alias" | "enable" | "requires" | "diagnostic" | "const_assert" => {
                r.until(&[";"])?;
                r.at += 1;
            }
            _ => {
                r.at -= 1;
                return Err(r.unexpected("`fn`, `var`, `const`, `override`, `struct` or `alias` at module scope"));
            }
        }
    }
    Ok(m)
}

/// The value of an integer literal (`256`, `256u`, `0x100i`) or of a
/// constant naming one.
fn integer(m: &Module, toks: &[Token]) -> Option<u32> {
    let [t] = toks else { return None };
    let text = if t.kind == Kind::Ident { m.consts.get(t.text)? } else { t.text };
    let digits = text.trim_end_matches(['u', 'i']);
    match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => digits.parse().ok(),
    }
}

fn attribute<'m, 'a>(attributes: &'m [Attribute<'a>], name: &str) -> Option<&'m Attribute<'a>> {
    attributes.iter().find(|a| a.name == name)
}

/// The entry point `main` and the globals with a binding, as the contract
/// reads them (see `wgsl::check_interface`), or why the kernel cannot be read.
pub(crate) fn read(full: &str) -> Scan<(Option<Entry>, Vec<Global>)> {
    let toks = tokens(full)?;
    let m = read_module(&toks)?;
    let Some((attributes, _)) = m.functions.get("main") else { return Ok((None, Vec::new())) };
    let stages = ["compute", "vertex", "fragment"];
    if !attributes.iter().any(|a| stages.contains(&a.name)) {
        return Ok((None, Vec::new()));
    }
    let mut workgroup_size = [0; 3];
    if let Some(a) = attribute(attributes, "workgroup_size") {
        workgroup_size = [1; 3];
        for (k, arg) in a.args.iter().enumerate().take(3) {
            workgroup_size[k] = integer(&m, arg).ok_or_else(|| {
                "`main`'s @workgroup_size could not be read: write it as @workgroup_size(256)".to_string()
            })?;
        }
    }
    let entry = Entry { compute: attribute(attributes, "compute").is_some(), workgroup_size };
    // Every identifier in `main` and the functions it reaches.
    let mut reached: HashSet<&str> = HashSet::new();
    let mut todo = vec!["main"];
    while let Some(f) = todo.pop() {
        if !reached.insert(f) {
            continue;
        }
        if let Some((_, idents)) = m.functions.get(f) {
            for &id in idents {
                if m.functions.contains_key(id) {
                    todo.push(id);
                } else {
                    reached.insert(id);
                }
            }
        }
    }
    let mut globals = Vec::new();
    for var in &m.vars {
        let group = attribute(&var.attributes, "group");
        let binding = attribute(&var.attributes, "binding");
        let (group, binding) = match (group, binding) {
            (None, None) => continue,
            (Some(g), Some(b)) => (g, b),
            _ => return Err(format!("`{}` needs both @group and @binding", var.name)),
        };
        let number = |a: &Attribute| {
            a.args
                .first()
                .and_then(|arg| integer(&m, arg))
                .ok_or_else(|| format!("`{}`'s @{} could not be read: write a number", var.name, a.name))
        };
        let storage = match var.template.as_slice() {
            ["storage"] | ["storage", "read"] => Some(false),
            ["storage", _] => Some(true),
            _ => None,
        };
        let dtype = match var.ty.as_slice() {
            ["array", element] | ["array", element, ",", _] => match *element {
                "f32" => Some(DType::F32),
                "i32" => Some(DType::I32),
                "u32" => Some(DType::Bool),
                _ => None,
            },
            _ => None,
        };
        globals.push(Global {
            name: var.name.to_string(),
            group: number(group)?,
            binding: number(binding)?,
            storage,
            dtype,
            used: reached.contains(var.name),
        });
    }
    Ok((Some(entry), globals))
}

#[cfg(test)]
mod tests {
    use super::super::wgsl::{check_interface, PRELUDE};
    use crate::dtype::DType;

    use super::super::DOUBLING_KERNEL as GOOD;

    /// What the scan says of a kernel: its bindings' dtypes, or the reason.
    fn scan(source: &str, arity: usize) -> Result<Vec<DType>, String> {
        let (entry, globals) = super::read(&format!("{source}\n{PRELUDE}"))?;
        check_interface(arity, entry, globals)
    }

    fn error(source: &str, arity: usize) -> String {
        scan(source, arity).expect_err(source)
    }

    #[test]
    fn a_kernel_following_the_contract_passes() {
        assert_eq!(scan(GOOD, 1).unwrap(), vec![DType::F32, DType::F32]);
        // Comments, a helper function reached from main, consts, i32/u32
        // arrays, `var<storage>` (read by default), hex and suffixed sizes.
        let other = "
/* outer /* nested */ comment */
const N: u32 = 0x100u;
@group(0) @binding(1) var<storage> a: array<i32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>; // bool words
fn helper(i: u32) -> f32 { return b[i] * 2.0e-1; }
@compute @workgroup_size(N, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = kiln_index(wid, nwg, lid);
    if (i >= kiln_len()) { return; }
    out[i] = select(0u, 1u, f32(a[i]) > helper(i));
}
";
        assert_eq!(scan(other, 2).unwrap(), vec![DType::I32, DType::F32, DType::Bool]);
    }

    #[test]
    fn bracket_mistakes_name_their_line_and_column() {
        let e = error(&GOOD.replace("2.0 * x[i]", "2.0 * (x[i]"), 1);
        assert!(
            e.contains("does not parse") && e.contains("wgsl:10:1: `}` does not close the `(` opened at 9:18"),
            "{e}"
        );
        let e = error(&GOOD.replace("fn main(", "fn main(("), 1);
        assert!(e.contains("wgsl:5:"), "{e}");
        let e = error(&format!("{GOOD}\n}}"), 1);
        assert!(e.contains("`}` closes nothing"), "{e}");
        let e = error(&GOOD.replace("y[i] =", "/* y[i] ="), 1);
        assert!(e.contains("wgsl:9:5: this block comment is never closed"), "{e}");
        let e = error(&GOOD.replace("fn main", "fun main"), 1);
        assert!(e.contains("wgsl:5:1: expected"), "{e}");
    }

    #[test]
    fn contract_breaches_are_refused_with_the_reason() {
        assert!(error(&GOOD.replace("fn main", "fn run"), 1).contains("no entry point `main`"));
        assert!(error(&GOOD.replace("@compute @workgroup_size(256)", ""), 1).contains("no entry point `main`"));
        assert!(error(&GOOD.replace("@compute", "@vertex"), 1).contains("not a @compute entry point"));
        assert!(error(&GOOD.replace("(256)", "(64)"), 1).contains("@workgroup_size[64, 1, 1]"));
        assert!(error(&GOOD.replace("(256)", "(256, 2)"), 1).contains("@workgroup_size[256, 2, 1]"));
        assert!(error(GOOD, 2).contains("must be read (it is an input)"));
        assert!(error(&GOOD.replace("read> x", "read_write> x"), 1).contains("must be read (it is an input)"));
        assert!(error(&GOOD.replace("read_write> y", "read> y"), 1).contains("must be read_write (it is the output)"));
        assert!(error(&GOOD.replace("storage, read> x", "uniform> x"), 1).contains("is not a storage buffer"));
        assert!(error(&GOOD.replace("@group(0) @binding(1)", "@group(1) @binding(1)"), 1).contains("group 1"));
        assert!(error(&GOOD.replace("@binding(2)", "@binding(5)"), 1).contains("uses binding 5"));
        assert!(error(&GOOD.replace("@binding(1)", "@binding(0)"), 1).contains("binding 0, which holds"));
        let vector = GOOD.replace("x: array<f32>", "x: array<vec2<f32>>");
        assert!(error(&vector, 1).contains("`x` (binding 1) is not an array of f32, i32 or u32"));
        let unchecked = GOOD.replace("if (i >= kiln_len()) { return; }", "");
        assert!(error(&unchecked, 1).contains("never reads kiln_len()"));
        assert!(error(&GOOD.replace("2.0 * x[i]", "2.0"), 1)
            .contains("`x` (binding 1) is declared but `main` never uses it"));
        assert!(error(&GOOD.replace("@binding(1) var<storage, read> x: array<f32>;", ""), 1)
            .contains("no binding 1 for input 0"));
        assert!(
            error(&GOOD.replace("@group(0) @binding(1)", "@binding(1)"), 1).contains("needs both @group and @binding")
        );
    }

    /// naga and the scan agree on every contract breach above (the same
    /// messages reach users of either build).
    #[cfg(feature = "wgsl")]
    #[test]
    fn the_scan_agrees_with_naga_on_the_contract() {
        let cases = [
            (GOOD.to_string(), 1),
            (GOOD.to_string(), 2),
            (GOOD.replace("fn main", "fn run"), 1),
            (GOOD.replace("(256)", "(64)"), 1),
            (GOOD.replace("read> x", "read_write> x"), 1),
            (GOOD.replace("@group(0) @binding(1)", "@group(1) @binding(1)"), 1),
            (GOOD.replace("@binding(2)", "@binding(5)"), 1),
            (GOOD.replace("x: array<f32>", "x: array<vec2<f32>>").replace("2.0 * x[i]", "2.0 * x[i].x"), 1),
            (GOOD.replace("if (i >= kiln_len()) { return; }", ""), 1),
            (GOOD.replace("2.0 * x[i]", "2.0"), 1),
        ];
        for (source, arity) in cases {
            let naga = super::super::wgsl::validate("T", arity, &source).map(|k| k.bindings).map_err(|e| e.to_string());
            let ours = scan(&source, arity).map_err(|what| super::super::wgsl::refusal("T", what).to_string());
            assert_eq!(naga, ours, "{source}");
        }
    }
}
