//! Counts of the host heap, kept by `CountingAllocator` when a binary
//! installs it as its global allocator (`kiln` does). Reads are None in a
//! program that did not: nothing was counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting allocations and bytes requested
/// (reallocations count as one allocation of the new size).
pub struct CountingAllocator;

// SAFETY: every method forwards to `System` with the caller's own
// arguments, so `System`'s guarantees are ours; the counters are atomics
// and never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: forwarded as received (see the impl's comment).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        BYTES.fetch_add(new_size as u64, Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// (allocations, bytes) since the program started, or None when no
/// `CountingAllocator` is installed.
pub fn counts() -> Option<(u64, u64)> {
    let n = ALLOCATIONS.load(Relaxed);
    (n > 0).then(|| (n, BYTES.load(Relaxed)))
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout};

    use super::*;

    /// Every method hands back usable memory (zeroed where asked, contents
    /// kept by realloc) and counts the request; also run under Miri
    /// (scripts/miri-host-heap.sh), which checks the forwarding to `System`.
    #[test]
    fn counts_and_forwards_every_request() {
        let a = CountingAllocator;
        let before = (ALLOCATIONS.load(Relaxed), BYTES.load(Relaxed));
        let layout = Layout::from_size_align(64, 16).unwrap();
        // SAFETY: non-zero-size layouts; each pointer is checked for null,
        // used within its size and freed once with the layout it has.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            for i in 0..64 {
                p.add(i).write(i as u8);
            }
            let q = a.realloc(p, layout, 256);
            assert!(!q.is_null());
            assert!((0..64).all(|i| q.add(i).read() == i as u8), "realloc keeps the contents");
            a.dealloc(q, Layout::from_size_align(256, 16).unwrap());
            let z = a.alloc_zeroed(layout);
            assert!(!z.is_null());
            assert!((0..64).all(|i| z.add(i).read() == 0));
            a.dealloc(z, layout);
        }
        let after = (ALLOCATIONS.load(Relaxed), BYTES.load(Relaxed));
        // Other threads of a test binary that installs the allocator may
        // allocate meanwhile: at least this test's 3 requests and bytes.
        assert!(after.0 - before.0 >= 3 && after.1 - before.1 >= 64 + 256 + 64, "{before:?} -> {after:?}");
        assert!(counts().is_some());
    }
}
