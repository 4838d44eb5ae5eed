//! Fallible host allocation. Every host vector whose length comes from user
//! input (a tensor's size, a layer's width) is made here: a request the
//! machine cannot meet is an out-of-memory error naming the op and the
//! bytes, where `vec![0; len]` would abort the process.

use crate::error::{Error, Result};

/// `len` copies of `value`, or an out-of-memory error naming `op`.
#[track_caller]
pub fn try_vec<T: Clone>(op: &'static str, len: usize, value: T) -> Result<Vec<T>> {
    let mut v = try_with_capacity(op, len)?;
    v.resize(len, value);
    Ok(v)
}

/// `len` values made by `next`, in order, or an out-of-memory error.
#[track_caller]
pub fn try_from_fn<T>(op: &'static str, len: usize, mut next: impl FnMut() -> T) -> Result<Vec<T>> {
    let mut v = try_with_capacity(op, len)?;
    v.extend(std::iter::repeat_with(&mut next).take(len));
    Ok(v)
}

/// An empty vector with room for exactly `len` values.
#[track_caller]
pub fn try_with_capacity<T>(op: &'static str, len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    if v.try_reserve_exact(len).is_err() {
        return Err(out_of_memory(op, len.saturating_mul(std::mem::size_of::<T>()), len, std::any::type_name::<T>()));
    }
    Ok(v)
}

/// The error for a refused allocation of `bytes` (`len` values of `what`).
#[track_caller]
pub fn out_of_memory(op: &'static str, bytes: usize, len: usize, what: &str) -> Error {
    Error::backend(op, format!("out of memory: cannot allocate {bytes} bytes ({len} x {what})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn refused_allocations_are_errors() {
        let e = try_vec::<f64>("Linear", usize::MAX / 16, 0.0).unwrap_err();
        assert_eq!((e.kind(), e.op()), (ErrorKind::Backend, "Linear"));
        assert!(e.message().contains("out of memory") && e.message().contains("bytes"), "{e}");
        assert_eq!(e.location().file(), file!());
        // Larger than the address space: the byte count saturates.
        assert!(try_with_capacity::<u64>("x", usize::MAX).is_err());
        let mut n = 0;
        assert_eq!(
            try_from_fn("x", 3, || {
                n += 1;
                n
            })
            .unwrap(),
            vec![1, 2, 3]
        );
        assert_eq!(try_vec("x", 2, 7u8).unwrap(), vec![7, 7]);
    }
}
