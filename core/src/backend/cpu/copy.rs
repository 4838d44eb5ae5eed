//! Element copies without glibc's `rep movsb` path.
//!
//! glibc's memcpy (the AVX2 variant) copies from 4 KiB up to a size near
//! the L3 cache with `rep movsb`. On the Zen 3 build machines that path ran
//! at ~2 GB/s, against ~40 GB/s for vector moves (f32 buffers copied in a
//! loop, best of three: 4–64 KiB at 1.8–2.8 GB/s; 2 KiB and 256 KiB+ at
//! 31–68 GB/s either way). The rows of a slice, concat, permute or gather
//! and a fused group's tiles are in that range, so kernels copy through
//! `copy`, whose fixed-size pieces compile to vector moves.

/// Elements per piece: 256 bytes of f32, a size compilers copy inline.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
const PIECE: usize = 64;

/// `dst.copy_from_slice(src)`, in pieces of `PIECE` elements on x86 (the
/// `rep movsb` above); elsewhere the library copy itself (in the browser
/// build, one `memory.copy`, and no unrolled copies in the download).
///
/// # Panics
/// When the lengths differ, as `copy_from_slice` does.
#[inline(always)]
pub(super) fn copy<V: Copy>(dst: &mut [V], src: &[V]) {
    assert_eq!(dst.len(), src.len(), "copy: lengths differ");
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        let mut to = dst.chunks_exact_mut(PIECE);
        let mut from = src.chunks_exact(PIECE);
        for (d, s) in (&mut to).zip(&mut from) {
            let d: &mut [V; PIECE] = d.try_into().expect("chunks_exact gives whole pieces");
            *d = *<&[V; PIECE]>::try_from(s).expect("chunks_exact gives whole pieces");
        }
        to.into_remainder().copy_from_slice(from.remainder());
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::copy;

    /// Whole pieces, a remainder, both and neither, for a 4- and a 1-byte
    /// element type: every element copied, nothing past the end written.
    #[test]
    fn copies_every_element_and_nothing_more() {
        for n in [0usize, 1, 63, 64, 65, 127, 128, 1000, 1024, 5000] {
            let src: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
            let mut dst = vec![-1.0f32; n + 3];
            copy(&mut dst[..n], &src);
            assert_eq!(&dst[..n], &src[..], "{n} f32");
            assert_eq!(&dst[n..], &[-1.0; 3], "{n} f32: written past the end");
            let bytes: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let mut out = vec![255u8; n];
            copy(&mut out, &bytes);
            assert_eq!(out, bytes, "{n} bytes");
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn different_lengths_panic() {
        copy(&mut [0u8; 3], &[1u8; 4]);
    }
}
