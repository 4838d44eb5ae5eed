//! `SmallVec`: short lists (shapes, a node's inputs, a batch of kernels)
//! without a heap allocation natively, as the `smallvec` crate's inline
//! vectors; a thin wrapper over `Vec` in the browser build.
//!
//! Why two forms: smallvec's code is instantiated once per element type and
//! inline size (about forty of them in kiln), and each inline/heap branch is
//! compiled into its users. Natively that is a good trade (graph building
//! allocates less); in the wasm every byte is downloaded, and `Vec`'s
//! growth code is shared by all of them. The wrapper keeps the API kiln
//! uses (`SmallVec::new`, `from_slice`, `from_elem`, `smallvec!`, and
//! everything of `Vec` through `Deref`), so call sites are the same.
//!
//! Two users keep smallvec's inline vectors in the browser too, because
//! they allocate per node on every step: the executor's per-batch lists
//! (`exec.rs`) and shapes (`shape::Dims`). Measured in headless Chromium
//! (wasm CPU path, 3 interleaved rounds): with everything on `Vec` the
//! download was 11.6 KB smaller but W3, the 1,000-op graph-overhead step,
//! took 13 → 19–25 ms; with those two inline, 5.3 KB smaller and W3's best
//! step 11.5–12.1 → 12.4–13.3 ms. W1 did not change.

#[cfg(not(target_arch = "wasm32"))]
pub use smallvec::{smallvec, SmallVec};

#[cfg(target_arch = "wasm32")]
pub use wasm::SmallVec;

#[cfg(target_arch = "wasm32")]
pub use crate::__kiln_smallvec as smallvec;

/// `smallvec!` for the browser build's `SmallVec` (`vec!` underneath).
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
#[macro_export]
macro_rules! __kiln_smallvec {
    ($($x:tt)*) => {
        $crate::small::SmallVec::from_vec(::std::vec![$($x)*])
    };
}

#[cfg(target_arch = "wasm32")]
mod wasm {
    use std::ops::{Deref, DerefMut};

    /// A `Vec` typed like smallvec's `SmallVec<[T; N]>`.
    pub struct SmallVec<A: smallvec::Array>(Vec<A::Item>);

    impl<A: smallvec::Array> SmallVec<A> {
        pub fn new() -> Self {
            SmallVec(Vec::new())
        }
        pub fn with_capacity(n: usize) -> Self {
            SmallVec(Vec::with_capacity(n))
        }
        pub fn from_vec(v: Vec<A::Item>) -> Self {
            SmallVec(v)
        }
        pub fn from_slice(s: &[A::Item]) -> Self
        where
            A::Item: Clone,
        {
            SmallVec(s.to_vec())
        }
        pub fn from_elem(x: A::Item, n: usize) -> Self
        where
            A::Item: Clone,
        {
            SmallVec(vec![x; n])
        }
        pub fn into_vec(self) -> Vec<A::Item> {
            self.0
        }
    }

    impl<A: smallvec::Array> Default for SmallVec<A> {
        fn default() -> Self {
            SmallVec(Vec::new())
        }
    }

    impl<A: smallvec::Array> Deref for SmallVec<A> {
        type Target = Vec<A::Item>;
        fn deref(&self) -> &Vec<A::Item> {
            &self.0
        }
    }

    impl<A: smallvec::Array> DerefMut for SmallVec<A> {
        fn deref_mut(&mut self) -> &mut Vec<A::Item> {
            &mut self.0
        }
    }

    impl<A: smallvec::Array> Clone for SmallVec<A>
    where
        A::Item: Clone,
    {
        fn clone(&self) -> Self {
            SmallVec(self.0.clone())
        }
    }

    impl<A: smallvec::Array> std::fmt::Debug for SmallVec<A>
    where
        A::Item: std::fmt::Debug,
    {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.fmt(f)
        }
    }

    impl<A: smallvec::Array, B: smallvec::Array> PartialEq<SmallVec<B>> for SmallVec<A>
    where
        A::Item: PartialEq<B::Item>,
    {
        fn eq(&self, other: &SmallVec<B>) -> bool {
            self.0[..] == other.0[..]
        }
    }

    impl<A: smallvec::Array> Eq for SmallVec<A> where A::Item: Eq {}

    impl<A: smallvec::Array> std::hash::Hash for SmallVec<A>
    where
        A::Item: std::hash::Hash,
    {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            self.0.hash(state)
        }
    }

    impl<A: smallvec::Array> FromIterator<A::Item> for SmallVec<A> {
        fn from_iter<I: IntoIterator<Item = A::Item>>(iter: I) -> Self {
            SmallVec(iter.into_iter().collect())
        }
    }

    impl<A: smallvec::Array> IntoIterator for SmallVec<A> {
        type Item = A::Item;
        type IntoIter = std::vec::IntoIter<A::Item>;
        fn into_iter(self) -> Self::IntoIter {
            self.0.into_iter()
        }
    }

    impl<'a, A: smallvec::Array> IntoIterator for &'a SmallVec<A> {
        type Item = &'a A::Item;
        type IntoIter = std::slice::Iter<'a, A::Item>;
        fn into_iter(self) -> Self::IntoIter {
            self.0.iter()
        }
    }

    impl<'a, A: smallvec::Array> IntoIterator for &'a mut SmallVec<A> {
        type Item = &'a mut A::Item;
        type IntoIter = std::slice::IterMut<'a, A::Item>;
        fn into_iter(self) -> Self::IntoIter {
            self.0.iter_mut()
        }
    }

    impl<A: smallvec::Array> From<&[A::Item]> for SmallVec<A>
    where
        A::Item: Clone,
    {
        fn from(s: &[A::Item]) -> Self {
            SmallVec(s.to_vec())
        }
    }

    impl<A: smallvec::Array> From<Vec<A::Item>> for SmallVec<A> {
        fn from(v: Vec<A::Item>) -> Self {
            SmallVec(v)
        }
    }

    impl<A: smallvec::Array> Extend<A::Item> for SmallVec<A> {
        fn extend<I: IntoIterator<Item = A::Item>>(&mut self, iter: I) {
            self.0.extend(iter)
        }
    }

    impl<A: smallvec::Array> std::borrow::Borrow<[A::Item]> for SmallVec<A> {
        fn borrow(&self) -> &[A::Item] {
            &self.0
        }
    }

    impl<A: smallvec::Array> AsRef<[A::Item]> for SmallVec<A> {
        fn as_ref(&self) -> &[A::Item] {
            &self.0
        }
    }
}
