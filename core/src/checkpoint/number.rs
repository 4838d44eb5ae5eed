//! Decimal text to `f64` for checkpoint metadata (learning rates, betas,
//! eps), exactly as `str::parse::<f64>` reads it: the same syntax is
//! accepted and every value is the same bits (tests compare the two on
//! hundreds of thousands of strings).
//!
//! Why not `str::parse`: the standard library's fast algorithm
//! (Eisel–Lemire) carries a table of 696 128-bit powers of five, 11 KB that
//! gzip cannot shrink, plus its slow fallback; in the browser package that
//! was ~12 KB of the gzipped download for a few numbers per checkpoint.
//! This reader has no table and no fast path: it rounds the exact quotient
//! of two big integers, which costs microseconds per number (metadata holds
//! a dozen).

use std::cmp::Ordering;

/// Significant digits kept; any further nonzero digit is folded into one
/// sticky digit. A double or a point halfway between two doubles has at
/// most 767 significant decimal digits, so no digit past the 768th can
/// decide the rounding: 800 leaves room.
const MAX_DIGITS: usize = 800;

/// `text` as `str::parse::<f64>` reads it: an optional sign, then `inf`,
/// `infinity` or `nan` (any case), or digits with an optional point and an
/// optional exponent (`e`/`E`, optional sign, digits). None where that
/// refuses the text; the correctly rounded value (±inf past the range,
/// ±0 below it) otherwise.
pub(crate) fn parse_f64(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    let (negative, rest) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    let value = if rest.eq_ignore_ascii_case(b"inf") || rest.eq_ignore_ascii_case(b"infinity") {
        f64::INFINITY
    } else if rest.eq_ignore_ascii_case(b"nan") {
        f64::NAN
    } else {
        unsigned(rest)?
    };
    Some(if negative { -value } else { value })
}

/// A number without its sign.
fn unsigned(b: &[u8]) -> Option<f64> {
    // value = 0.d1 d2 d3 ... × 10^point, d1 != 0.
    let mut digits: Vec<u8> = Vec::new();
    let mut point: i64 = 0;
    let (mut any, mut seen_point, mut sticky) = (false, false, false);
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            c @ b'0'..=b'9' => {
                any = true;
                let d = c - b'0';
                if digits.is_empty() && d == 0 {
                    // A leading zero: after the point it scales the value down.
                    point -= seen_point as i64;
                } else {
                    point += !seen_point as i64;
                    if digits.len() < MAX_DIGITS {
                        digits.push(d);
                    } else {
                        sticky |= d != 0;
                    }
                }
            }
            b'.' if !seen_point => seen_point = true,
            _ => break,
        }
        i += 1;
    }
    if !any {
        return None;
    }
    if i < b.len() && (b[i] | 0x20) == b'e' {
        i += 1;
        let negative = b.get(i) == Some(&b'-');
        i += matches!(b.get(i), Some(b'-' | b'+')) as usize;
        let start = i;
        let mut e: i64 = 0;
        while i < b.len() && b[i].is_ascii_digit() {
            // Saturates far past any exponent that still gives a finite,
            // nonzero value (the digit count is below 2^40 too).
            e = (e * 10 + (b[i] - b'0') as i64).min(1 << 40);
            i += 1;
        }
        if i == start {
            return None;
        }
        point += if negative { -e } else { e };
    }
    if i != b.len() {
        return None;
    }
    if sticky {
        // Stands for the dropped nonzero tail: above the kept digits and
        // below their next step, like the tail itself.
        digits.push(1);
    }
    while digits.last() == Some(&0) {
        digits.pop();
    }
    if digits.is_empty() || point < -330 {
        // Below 10^-330, under half the smallest subnormal (4.9e-324).
        return Some(0.0);
    }
    if point > 310 {
        return Some(f64::INFINITY);
    }
    Some(nearest(&digits, point - digits.len() as i64))
}

/// The double nearest to `digits` (an integer) × 10^exp10, ties to even.
fn nearest(digits: &[u8], exp10: i64) -> f64 {
    let mut num = Big(Vec::new());
    for &d in digits {
        num.mul_add(10, d as u32);
    }
    let mut den = Big(vec![1]);
    let scaled = if exp10 >= 0 { &mut num } else { &mut den };
    for _ in 0..exp10.unsigned_abs() {
        scaled.mul_add(10, 0);
    }
    // value = q × 2^e with q in [2^52, 2^53) (a normal double), or e at
    // the subnormal exponent -1074 and q below 2^52; q is rounded from
    // num / (den × 2^e).
    let mut e = (num.bits() - den.bits() - 53).max(-1074);
    loop {
        let (mut n, mut d) = (num.clone(), den.clone());
        if e < 0 {
            n.shl(e.unsigned_abs());
        } else {
            d.shl(e as u64);
        }
        // n / d < 2^54 by the choice of e: 55 quotient bits at most.
        let mut q: u64 = 0;
        for bit in (0..55).rev() {
            let mut step = d.clone();
            step.shl(bit);
            if n.compare(&step) != Ordering::Less {
                n.sub(&step);
                q |= 1 << bit;
            }
        }
        if q >= 1 << 53 {
            e += 1;
            continue;
        }
        n.shl(1);
        let round_up = match n.compare(&d) {
            Ordering::Greater => true,
            Ordering::Equal => q & 1 == 1,
            Ordering::Less => false,
        };
        // The exponent field counts from the subnormals' e = -1074; q's
        // 2^52 bit (and a carry of the rounding into 2^53) steps it on.
        let bits = (((e + 1074) as u64) << 52) + q + round_up as u64;
        return if bits >= f64::INFINITY.to_bits() { f64::INFINITY } else { f64::from_bits(bits) };
    }
}

/// A non-negative integer, 32-bit limbs, least significant first, no zero
/// limbs on top.
#[derive(Clone)]
struct Big(Vec<u32>);

impl Big {
    /// self = self × m + a.
    fn mul_add(&mut self, m: u32, a: u32) {
        let mut carry = a as u64;
        for limb in &mut self.0 {
            let v = *limb as u64 * m as u64 + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry != 0 {
            self.0.push(carry as u32);
        }
    }

    /// self = self × 2^n.
    fn shl(&mut self, n: u64) {
        if self.0.is_empty() {
            return;
        }
        let (limbs, bits) = ((n / 32) as usize, (n % 32) as u32);
        if bits != 0 {
            let mut carry = 0;
            for limb in &mut self.0 {
                let v = *limb;
                *limb = (v << bits) | carry;
                carry = v >> (32 - bits);
            }
            if carry != 0 {
                self.0.push(carry);
            }
        }
        self.0.splice(0..0, std::iter::repeat_n(0, limbs));
    }

    /// self = self - other, other <= self.
    fn sub(&mut self, other: &Big) {
        let mut borrow = 0i64;
        for (i, limb) in self.0.iter_mut().enumerate() {
            let v = *limb as i64 - other.0.get(i).copied().unwrap_or(0) as i64 - borrow;
            borrow = (v < 0) as i64;
            *limb = v as u32;
        }
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn compare(&self, other: &Big) -> Ordering {
        self.0.len().cmp(&other.0.len()).then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }

    /// Significant bits (0 for zero).
    fn bits(&self) -> i64 {
        self.0.last().map_or(0, |top| 32 * self.0.len() as i64 - top.leading_zeros() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_f64;

    /// Same acceptance and the same bits as the standard library.
    fn agrees(text: &str) {
        let ours = parse_f64(text).map(f64::to_bits);
        let std = text.parse::<f64>().ok().map(f64::to_bits);
        assert_eq!(ours, std, "{text:?}: kiln {:?}, std {:?}", ours.map(f64::from_bits), std.map(f64::from_bits));
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            // splitmix64
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn syntax_is_the_standard_librarys() {
        for text in [
            "",
            "+",
            "-",
            ".",
            "+.",
            "e",
            "e5",
            ".e5",
            "1e",
            "1e+",
            "1e-",
            "1.",
            ".5",
            "+.5",
            "-.5e-3",
            "5.e2",
            "1..2",
            "1.2.3",
            "1e5e5",
            "1e5.5",
            " 1",
            "1 ",
            "1_0",
            "0x10",
            "1f",
            "inf",
            "-inf",
            "+inf",
            "INF",
            "Infinity",
            "-infinity",
            "InFiNiTy",
            "infin",
            "infx",
            "nan",
            "NaN",
            "-nan",
            "+NAN",
            "nanx",
            "n",
            "i",
            "0",
            "-0",
            "+0",
            "00",
            "0.0",
            "-0.0e99",
            "000123.4500",
            "0e0",
            "0E-0",
            "1E5",
            "1e+5",
            "1e-5",
            "1e0000000000000000000005",
            "1e99999999999999999999999",
            "1e-99999999999999999999999",
            "0e99999999999999999999",
            "٣",
            "1\u{0}",
        ] {
            agrees(text);
        }
    }

    #[test]
    fn boundaries() {
        for text in [
            "1.7976931348623157e308",
            "1.7976931348623158e308",
            "1.7976931348623158079e308",
            "1.797693134862315807937289714053e308",
            "1.7976931348623159e308",
            "1.8e308",
            "1e309",
            "4.9406564584124654e-324",
            "2.4703282292062327e-324",
            "2.4703282292062328e-324",
            "2.47032822920623272e-324",
            "2.470328229206232720882538e-324",
            "2.2250738585072011e-308",
            "2.2250738585072012e-308",
            "2.2250738585072014e-308",
            "1e-330",
            "1e-331",
            "9.999e-331",
            "1e310",
            "0.1",
            "0.2",
            "0.3",
            "1e23",
            "8.589973e9",
            "9007199254740993",
            "9007199254740992.5",
            "9007199254740993.0000000000000000000000000000000000000001",
            "123456789012345678901234567890",
            "0.001",
            "0.0001",
            "1e-8",
            "0.9",
            "0.999",
            "3e-4",
        ] {
            agrees(text);
        }
        // More digits than are kept, with and without a nonzero tail.
        let long = format!("0.{}", "1".repeat(2000));
        agrees(&long);
        agrees(&format!("1{}", "0".repeat(900)));
        agrees(&format!("1{}e-900", "0".repeat(900)));
        agrees(&format!("{}e-1000", "9".repeat(1200)));
        agrees(&format!("0.{}1", "0".repeat(400)));
    }

    /// Every double printed as Rust prints it (shortest, `{:e}`) and with
    /// more digits than it has, and the points halfway to its neighbours,
    /// exactly and a hair either side.
    #[test]
    fn doubles_and_halfway_points() {
        let mut rng = Rng(42);
        for _ in 0..40_000 {
            let v = f64::from_bits(rng.next());
            if !v.is_finite() {
                continue;
            }
            agrees(&v.to_string());
            agrees(&format!("{v:e}"));
            agrees(&format!("{v:.25e}"));
            agrees(&format!("{:.17e}", v.abs()));
            // Halfway to the next double up: exact in decimal (a finite
            // binary fraction), printed with all its digits.
            let next = f64::from_bits(v.abs().to_bits() + 1);
            if next.is_finite() {
                let half = exact_midpoint(v.abs(), next);
                agrees(&half);
                agrees(&bump(&half, 1));
                agrees(&bump(&half, -1));
            }
        }
    }

    /// Small and mid-size numbers the way people write them.
    #[test]
    fn written_numbers() {
        let mut rng = Rng(7);
        for _ in 0..100_000 {
            let digits: String = (0..1 + rng.below(25)).map(|_| char::from(b'0' + rng.below(10) as u8)).collect();
            let at = rng.below(digits.len() as u64 + 1) as usize;
            let mut text = format!("{}.{}", &digits[..at], &digits[at..]);
            if rng.below(3) == 0 {
                text = format!("{text}e{}", rng.below(700) as i64 - 350);
            }
            agrees(&text);
        }
    }

    /// The exact decimal of (a + b) / 2 for adjacent doubles a < b: an
    /// integer times 2^k, written out digit by digit.
    fn exact_midpoint(a: f64, b: f64) -> String {
        let (ma, ea) = decompose(a);
        let (mb, eb) = decompose(b);
        // Bring both to the smaller exponent, then add: the sum / 2 is
        // m × 2^(e - 1).
        let e = ea.min(eb);
        let m = ((ma as u128) << (ea - e)) + ((mb as u128) << (eb - e));
        exact_decimal(m, e - 1)
    }

    /// (mantissa, exponent) with value = mantissa × 2^exponent.
    fn decompose(v: f64) -> (u64, i32) {
        let bits = v.to_bits();
        let exp = ((bits >> 52) & 0x7ff) as i32;
        let frac = bits & ((1 << 52) - 1);
        if exp == 0 {
            (frac, -1074)
        } else {
            (frac | (1 << 52), exp - 1075)
        }
    }

    /// m × 2^e in decimal, every digit.
    fn exact_decimal(m: u128, e: i32) -> String {
        // Decimal digits as a little-endian base-10 vector.
        let mut n: Vec<u32> = m.to_string().bytes().rev().map(|c| (c - b'0') as u32).collect();
        let times = |n: &mut Vec<u32>, f: u32| {
            let mut carry = 0;
            for d in n.iter_mut() {
                let v = *d * f + carry;
                *d = v % 10;
                carry = v / 10;
            }
            while carry > 0 {
                n.push(carry % 10);
                carry /= 10;
            }
        };
        if e >= 0 {
            for _ in 0..e {
                times(&mut n, 2);
            }
            return n.iter().rev().map(|d| char::from(b'0' + *d as u8)).collect();
        }
        // m / 2^k = m × 5^k / 10^k.
        for _ in 0..-e {
            times(&mut n, 5);
        }
        let s: String = n.iter().rev().map(|d| char::from(b'0' + *d as u8)).collect();
        format!("{s}e{e}")
    }

    /// The decimal string with its last mantissa digit stepped by `by` in
    /// the 60th place after it (a hair above or below).
    fn bump(text: &str, by: i32) -> String {
        let (mantissa, exp) = text.split_once('e').unwrap_or((text, "0"));
        let exp: i64 = exp.parse().unwrap();
        if by > 0 {
            format!("{mantissa}{}1e{}", "0".repeat(59), exp - 60)
        } else {
            // Subtract one unit in the 60th extra place: ...d - 1e-60 =
            // ...(d-1)999...9 (60 nines); a mantissa ending in 0 borrows.
            let mut digits: Vec<u8> = mantissa.bytes().collect();
            let mut i = digits.len();
            loop {
                i -= 1;
                if digits[i] == b'0' {
                    digits[i] = b'9';
                } else {
                    digits[i] -= 1;
                    break;
                }
            }
            format!("{}{}e{}", String::from_utf8(digits).unwrap(), "9".repeat(60), exp - 60)
        }
    }
}
