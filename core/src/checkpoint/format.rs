//! The safetensors format, read and written by kiln itself: 8 bytes of
//! little-endian header length, a JSON header
//! (`{"__metadata__": {string: string}, name: {"dtype", "shape",
//! "data_offsets"}, ...}`), then the tensors' bytes back to back.
//!
//! Why not the `safetensors` crate (which the tests still use to check this
//! module against): it parses the header with serde_json, and the two were
//! ~12 KB of the browser package's gzipped wasm; the header needs objects,
//! arrays, strings and integers only. The checks are the crate's (offsets
//! contiguous from 0, each tensor's byte length = its elements × its dtype's
//! size, the data ending where the file ends), plus kiln's own: no key twice
//! in any object, and at most `MAX_DEPTH` levels of nesting.

use std::collections::HashMap;

/// Every dtype the format names, with its size in bits.
const DTYPES: [(&str, usize); 20] = [
    ("BOOL", 8),
    ("F4", 4),
    ("F6_E2M3", 6),
    ("F6_E3M2", 6),
    ("U8", 8),
    ("I8", 8),
    ("F8_E5M2", 8),
    ("F8_E4M3", 8),
    ("F8_E8M0", 8),
    ("I16", 16),
    ("U16", 16),
    ("F16", 16),
    ("BF16", 16),
    ("I32", 32),
    ("U32", 32),
    ("F32", 32),
    ("F64", 64),
    ("I64", 64),
    ("U64", 64),
    ("C64", 64),
];

/// JSON nesting kiln follows before refusing a header (serde_json's limit
/// is 128; a safetensors header needs 3).
const MAX_DEPTH: usize = 64;

/// One tensor of a file: its dtype as the format spells it ("F32"), shape
/// and bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct View<'a> {
    pub dtype: &'static str,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

/// A parsed file: tensors by name in the order of their data, and the
/// string metadata.
pub(crate) struct File<'a> {
    tensors: Vec<(String, &'static str, Vec<usize>, &'a [u8])>,
    pub metadata: Option<HashMap<String, String>>,
}

impl<'a> File<'a> {
    /// Parse and check a whole file (the header and that the data fills the
    /// rest exactly). Errors are the reason, for "not a safetensors file: ".
    pub fn parse(bytes: &'a [u8]) -> Result<File<'a>, String> {
        let Some(first) = bytes.get(..8) else { return Err("header too small".into()) };
        let n = u64::from_le_bytes(first.try_into().expect("8 bytes"));
        let Some(header) = usize::try_from(n).ok().and_then(|n| bytes.get(8..8usize.checked_add(n)?)) else {
            return Err("invalid header length".into());
        };
        let data = &bytes[8 + header.len()..];
        let Json::Obj(entries) = parse_json(header)? else {
            return Err("invalid JSON in header: not an object".into());
        };
        let mut metadata = None;
        let mut tensors = Vec::with_capacity(entries.len());
        for (name, value) in entries {
            if name == "__metadata__" {
                metadata = Some(string_map(value)?);
            } else {
                let (dtype, shape, offsets) = tensor_info(&name, value)?;
                tensors.push((name, dtype, shape, offsets));
            }
        }
        tensors.sort_by_key(|t| t.3);
        let mut start = 0;
        let mut out = Vec::with_capacity(tensors.len());
        for (name, dtype, shape, (s, e)) in tensors {
            if s != start || e < s {
                return Err(format!("invalid offset for tensor `{name}`"));
            }
            start = e;
            let bits = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .and_then(|n| n.checked_mul(dtype_bits(dtype)))
                .ok_or("overflow computing buffer size from shape and/or element type")?;
            if bits % 8 != 0 || e - s != bits / 8 {
                return Err(format!("invalid shape, data type, or offset for tensor `{name}`"));
            }
            let Some(bytes) = data.get(s..e) else { return Err("incomplete metadata, file not fully covered".into()) };
            out.push((name, dtype, shape, bytes));
        }
        if start != data.len() {
            return Err("incomplete metadata, file not fully covered".into());
        }
        Ok(File { tensors: out, metadata })
    }

    pub fn tensor(&self, name: &str) -> Option<View<'_>> {
        self.tensors.iter().find(|t| t.0 == name).map(|t| View { dtype: t.1, shape: &t.2, data: t.3 })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.0.as_str())
    }
}

/// The end of the last tensor's data that a header announces (its largest
/// `data_offsets[1]`), from the header alone: a reader can stop there.
pub(crate) fn announced_data_end(header: &[u8]) -> Result<u64, String> {
    let Json::Obj(entries) = parse_json(header)? else {
        return Err("the header is not a JSON object".into());
    };
    let mut end = 0u64;
    for (key, entry) in &entries {
        if key == "__metadata__" {
            continue;
        }
        let offset = match entry {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == "data_offsets").and_then(|(_, v)| match v {
                Json::Arr(o) => o.get(1).and_then(Json::as_u64),
                _ => None,
            }),
            _ => None,
        };
        end = end.max(offset.ok_or_else(|| format!("tensor '{key}' has no data_offsets"))?);
    }
    Ok(end)
}

/// A file's bytes: `tensors` as (name, dtype as the format spells it,
/// shape, little-endian bytes), laid out as the safetensors crate does
/// (larger dtypes first, then by name; header padded with spaces to a
/// multiple of 8 bytes), metadata keys sorted so that the bytes are the
/// same run after run. The caller checks that each tensor's byte length
/// fits its shape and dtype.
pub(crate) fn serialize(
    tensors: &[(&str, &'static str, &[usize], &[u8])],
    metadata: &HashMap<String, String>,
) -> Vec<u8> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    let rank = |dtype: &str| DTYPES.iter().position(|(n, _)| *n == dtype).unwrap_or(0);
    order.sort_by(|&a, &b| rank(tensors[b].1).cmp(&rank(tensors[a].1)).then(tensors[a].0.cmp(tensors[b].0)));
    let mut header = String::from("{");
    if !metadata.is_empty() {
        let mut keys: Vec<&String> = metadata.keys().collect();
        keys.sort();
        header.push_str("\"__metadata__\":{");
        for (i, key) in keys.into_iter().enumerate() {
            if i > 0 {
                header.push(',');
            }
            push_string(&mut header, key);
            header.push(':');
            push_string(&mut header, &metadata[key]);
        }
        header.push('}');
    }
    let mut offset = 0;
    for (i, &t) in order.iter().enumerate() {
        let (name, dtype, shape, bytes) = tensors[t];
        if i > 0 || !metadata.is_empty() {
            header.push(',');
        }
        push_string(&mut header, name);
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            ":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{offset},{}]}}",
            dims.join(","),
            offset + bytes.len()
        ));
        offset += bytes.len();
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = Vec::with_capacity(8 + header.len() + offset);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &t in &order {
        out.extend_from_slice(tensors[t].3);
    }
    out
}

/// `s` as a JSON string literal (escaping as serde_json does).
fn push_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn dtype_bits(dtype: &str) -> usize {
    DTYPES.iter().find(|(n, _)| *n == dtype).map_or(0, |(_, b)| *b)
}

/// A tensor entry's dtype, shape and data offsets.
#[allow(clippy::type_complexity)]
fn tensor_info(name: &str, value: Json) -> Result<(&'static str, Vec<usize>, (usize, usize)), String> {
    let bad = |what: &str| format!("invalid JSON in header: tensor `{name}`: {what}");
    let Json::Obj(fields) = value else { return Err(bad("not an object")) };
    let (mut dtype, mut shape, mut offsets) = (None, None, None);
    for (key, v) in fields {
        match key.as_str() {
            "dtype" => {
                let Json::Str(s) = v else { return Err(bad("dtype is not a string")) };
                let known = DTYPES.iter().find(|(n, _)| *n == s).ok_or_else(|| bad(&format!("unknown dtype `{s}`")))?;
                dtype = Some(known.0);
            }
            "shape" => shape = Some(usizes(v).ok_or_else(|| bad("shape is not a list of sizes"))?),
            "data_offsets" => match usizes(v).as_deref() {
                Some(&[s, e]) => offsets = Some((s, e)),
                _ => return Err(bad("data_offsets is not [start, end]")),
            },
            _ => {}
        }
    }
    match (dtype, shape, offsets) {
        (Some(d), Some(s), Some(o)) => Ok((d, s, o)),
        _ => Err(bad("dtype, shape and data_offsets are required")),
    }
}

fn usizes(v: Json) -> Option<Vec<usize>> {
    let Json::Arr(items) = v else { return None };
    items.iter().map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok())).collect()
}

fn string_map(v: Json) -> Result<HashMap<String, String>, String> {
    let Json::Obj(entries) = v else { return Err("invalid JSON in header: __metadata__ is not an object".into()) };
    entries
        .into_iter()
        .map(|(k, v)| match v {
            Json::Str(s) => Ok((k, s)),
            _ => Err(format!("invalid JSON in header: __metadata__ entry '{k}' is not a string")),
        })
        .collect()
}

/// A JSON value; numbers keep their text (a header's are integers).
#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Num(text) => text.parse().ok(),
            _ => None,
        }
    }
}

/// Parse a whole header (UTF-8 JSON, whitespace around it allowed).
fn parse_json(bytes: &[u8]) -> Result<Json, String> {
    std::str::from_utf8(bytes).map_err(|e| format!("invalid UTF-8 in header: {e}"))?;
    let mut p = Parser { s: bytes, at: 0 };
    let v = p.value(0).and_then(|v| {
        p.blank();
        if p.at == bytes.len() {
            Ok(v)
        } else {
            Err("trailing characters".to_string())
        }
    });
    v.map_err(|e| if e.contains("appears twice") { e } else { format!("invalid JSON in header: {e} at byte {}", p.at) })
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn blank(&mut self) {
        while matches!(self.s.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.blank();
        let hit = self.s.get(self.at) == Some(&c);
        self.at += usize::from(hit);
        hit
    }

    fn word(&mut self, w: &str, v: Json) -> Result<Json, String> {
        if self.s[self.at..].starts_with(w.as_bytes()) {
            self.at += w.len();
            Ok(v)
        } else {
            Err("expected a value".into())
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, String> {
        if depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        self.blank();
        match self.s.get(self.at) {
            Some(b'{') => {
                self.at += 1;
                let mut fields: Vec<(String, Json)> = Vec::new();
                if self.eat(b'}') {
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.blank();
                    let key = self.string()?;
                    if fields.iter().any(|(k, _)| *k == key) {
                        return Err(format!("the key '{key}' appears twice in the header"));
                    }
                    if !self.eat(b':') {
                        return Err("expected `:`".into());
                    }
                    let v = self.value(depth + 1)?;
                    fields.push((key, v));
                    if self.eat(b'}') {
                        return Ok(Json::Obj(fields));
                    }
                    if !self.eat(b',') {
                        return Err("expected `,` or `}`".into());
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                if self.eat(b']') {
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.eat(b']') {
                        return Ok(Json::Arr(items));
                    }
                    if !self.eat(b',') {
                        return Err("expected `,` or `]`".into());
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(b'n') => self.word("null", Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err("expected a value".into()),
            None => Err("EOF while parsing a value".into()),
        }
    }

    /// A number by JSON's grammar, kept as text.
    fn number(&mut self) -> Result<Json, String> {
        let start = self.at;
        let digits = |p: &mut Self| {
            let from = p.at;
            while matches!(p.s.get(p.at), Some(b'0'..=b'9')) {
                p.at += 1;
            }
            p.at > from
        };
        self.at += usize::from(self.s[self.at] == b'-');
        if self.s.get(self.at) == Some(&b'0') {
            self.at += 1;
        } else if !digits(self) {
            return Err("invalid number".into());
        }
        if self.s.get(self.at) == Some(&b'.') {
            self.at += 1;
            if !digits(self) {
                return Err("invalid number".into());
            }
        }
        if matches!(self.s.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.s.get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if !digits(self) {
                return Err("invalid number".into());
            }
        }
        // The bytes are ASCII digits and signs: valid UTF-8.
        Ok(Json::Num(String::from_utf8_lossy(&self.s[start..self.at]).into_owned()))
    }

    /// A string literal at `at` (which must be `"`), unescaped.
    fn string(&mut self) -> Result<String, String> {
        if self.s.get(self.at) != Some(&b'"') {
            return Err("expected a string".into());
        }
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.at) else { return Err("EOF while parsing a string".into()) };
            self.at += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.at) else { return Err("EOF while parsing a string".into()) };
                    self.at += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if self.s.get(self.at..self.at + 2) != Some(b"\\u") {
                                    return Err("lone leading surrogate".into());
                                }
                                self.at += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err("invalid surrogate pair".into());
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            char::from_u32(code).ok_or("invalid \\u escape")?
                        }
                        _ => return Err("invalid escape".into()),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return Err("control character in a string".into()),
                c => out.push(c),
            }
        }
        // The input was checked to be UTF-8 and escapes add whole chars.
        String::from_utf8(out).map_err(|_| "invalid UTF-8 in a string".to_string())
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.s.get(self.at..self.at + 4).ok_or("EOF in a \\u escape")?;
        let text = std::str::from_utf8(digits).map_err(|_| "invalid \\u escape")?;
        let v = u32::from_str_radix(text, 16).map_err(|_| "invalid \\u escape")?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("invalid \\u escape".into());
        }
        self.at += 4;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn reads_what_it_writes() {
        let a: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b: Vec<u8> = [7.25f64].iter().flat_map(|v| v.to_le_bytes()).collect();
        let meta =
            HashMap::from([("format".to_string(), "pt".to_string()), ("q\"\n\\é".to_string(), "\u{1}☃".to_string())]);
        let bytes = serialize(&[("w", "F32", &[2], &a), ("b", "F64", &[], &b), ("e", "BOOL", &[0, 3], &[])], &meta);
        assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()) % 8, 0);
        let f = File::parse(&bytes).unwrap();
        assert_eq!(f.tensor("w"), Some(View { dtype: "F32", shape: &[2], data: &a }));
        assert_eq!(f.tensor("b"), Some(View { dtype: "F64", shape: &[], data: &b }));
        assert_eq!(f.tensor("e").unwrap().shape, &[0, 3]);
        assert_eq!(f.names().collect::<Vec<_>>(), ["b", "w", "e"], "larger dtypes first, as the crate writes");
        assert_eq!(f.metadata.as_ref(), Some(&meta));
        assert_eq!(serialize(&[("w", "F32", &[2], &a)], &meta), serialize(&[("w", "F32", &[2], &a)], &meta.clone()));
    }

    #[test]
    fn refuses_malformed_files_with_a_reason() {
        let e = r#"{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#;
        let four = [0u8; 4];
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![1, 2, 3], "header too small"),
            (u64::MAX.to_le_bytes().to_vec(), "invalid header length"),
            (file("[1]", &[]), "not an object"),
            (file(&format!(r#"{{"a":{e},"a":{e}}}"#), &four), "'a' appears twice"),
            (file(&format!(r#"{{"a":{e}}}"#), &[0u8; 5]), "not fully covered"),
            (file(&format!(r#"{{"a":{e}}}"#), &[0u8; 3]), "not fully covered"),
            (file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, &four), "invalid shape"),
            (file(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#, &[0; 8]), "invalid offset"),
            (file(r#"{"a":{"dtype":"X9","shape":[1],"data_offsets":[0,4]}}"#, &four), "unknown dtype `X9`"),
            (file(r#"{"a":{"dtype":"F32","shape":[1]}}"#, &four), "required"),
            (file(r#"{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#, &four), "shape"),
            (file(r#"{"__metadata__":{"k":1}}"#, &[]), "not a string"),
            (file(r#"{"a":"#, &[]), "EOF"),
            (file(r#"{"a" 1}"#, &[]), "expected `:`"),
            (file("{\"a\":\"\u{1}\"}", &[]), "control character"),
            (file(r#"{"a":"\ud800"}"#, &[]), "surrogate"),
            (file(r#"{"a":1} x"#, &[]), "trailing"),
            (file(r#"{"a":01}"#, &[]), "expected"),
            (file(&format!("{}{}", "[".repeat(100), "]".repeat(100)), &[]), "nested deeper"),
            (
                file(
                    r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}"#,
                    &[0; 8],
                ),
                "overflow",
            ),
        ];
        for (bytes, reason) in cases {
            let err = File::parse(&bytes).err().unwrap_or_else(|| panic!("accepted, expected {reason}"));
            assert!(err.contains(reason), "{err} (expected {reason})");
        }
        let mut bad_utf8 = file(r#"{"a":"xx"}"#, &[]);
        bad_utf8[14] = 0xff;
        assert!(File::parse(&bad_utf8).err().unwrap().contains("UTF-8"));
    }

    #[test]
    fn json_details() {
        let v =
            parse_json(br#" { "k" : [ 0 , -1.5e3 , true , false , null , "a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00" ] } "#)
                .unwrap();
        let Json::Obj(f) = v else { panic!() };
        assert_eq!(
            f[0].1,
            Json::Arr(vec![
                Json::Num("0".into()),
                Json::Num("-1.5e3".into()),
                Json::Bool(true),
                Json::Bool(false),
                Json::Null,
                Json::Str("a\"\\/\u{8}\u{c}\n\r\t\u{e9}\u{1f600}".into()),
            ])
        );
        assert_eq!(
            announced_data_end(br#"{"__metadata__":{},"a":{"data_offsets":[0,40]},"b":{"data_offsets":[40,48]}}"#),
            Ok(48)
        );
        assert!(announced_data_end(br#"{"a":{}}"#).unwrap_err().contains("no data_offsets"));
        let mut s = String::new();
        push_string(&mut s, "\u{1}\"x\u{7f}");
        assert_eq!(s, "\"\\u0001\\\"x\u{7f}\"");
    }
}
