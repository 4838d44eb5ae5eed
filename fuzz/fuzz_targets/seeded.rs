//! Structure-aware inputs from raw fuzzer bytes (the ideas of the proptest
//! `mutated` strategy in tests/tests/fuzz.rs): the first byte chooses between
//! the bytes as they are and edits of a valid seed file, so the fuzzer
//! reaches deep into a format without a corpus.

/// `data[0]` even: `data[1..]` itself. Odd: `seed` edited by `data[1..]`,
/// read as commands of 4 bytes (op, position low, position high, value):
/// xor a byte, truncate, insert a byte, or overwrite the 8 bytes at the
/// position with the bytes that follow.
pub fn input(seed: &[u8], data: &[u8]) -> Vec<u8> {
    let Some((&mode, rest)) = data.split_first() else { return Vec::new() };
    if mode & 1 == 0 {
        return rest.to_vec();
    }
    let mut v = seed.to_vec();
    let mut commands = rest.chunks_exact(4);
    for c in commands.by_ref() {
        let at = usize::from(u16::from_le_bytes([c[1], c[2]]));
        let value = c[3];
        match c[0] % 4 {
            0 if !v.is_empty() => {
                let i = at % v.len();
                v[i] ^= value.max(1);
            }
            1 => v.truncate(at % (v.len() + 1)),
            2 => {
                let i = at % (v.len() + 1);
                v.insert(i, value);
            }
            _ if v.len() >= 8 => {
                let i = at % (v.len() - 7);
                v[i..i + 8].copy_from_slice(&u64::from(value).wrapping_mul(0x0101_0101_0101_0101).to_le_bytes());
            }
            _ => {}
        }
    }
    v
}
