//! drainit's global allocator (`src/main.rs`): the C library's `malloc`
//! (musl's mallocng in the static build), with, on the proxy's threads only
//! ([`cache_this_thread`]), a cache of the blocks they free, up to
//! [`SMALL_MAX`] bytes, by size class, at most [`DEPTH`] blocks per class
//! ([`DEPTH_LARGE`] above [`FINE_MAX`] bytes). A proxied request allocates
//! and frees some fifty blocks (hyper's header maps and body channels,
//! futures, the ledger's entries); from the cache each is a pointer popped or
//! pushed instead of mallocng's slot search and lock (about 2,100 fewer
//! instructions per proxied request in a closed loop, 2,900 at 100 requests
//! per second, bench/README.md, "proxy.sh"). The init's
//! own threads go straight to `malloc`, so what an init without `--proxy`
//! keeps resident is unchanged.
//!
//! The classes are mallocng's own sizes or finer: mallocng serves a request
//! from a slot of 16·k − 4 bytes (16-byte units, 4 of them its header), `k`
//! from its table of classes; a block of a class here is a `malloc` of the
//! class's size, 16·n − 4 bytes up to [`FINE_MAX`] and mallocng's class sizes
//! above, so it takes the same slot as the request it serves would have, and
//! the cache wastes no memory on rounding.
//!
//! A thread's cache has no destructor (a global allocator may not use a
//! thread-local with one: registering it allocates): a thread that exits
//! calls [`flush_this_thread`] first (each proxy thread does as it ends, and
//! its runtime's blocking-pool threads through tokio's `on_thread_stop`), or
//! the blocks it cached stay allocated (at most 440 KB,
//! in practice what its last requests left).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;

/// The largest class with a size every 16 bytes (12, 28, ..., 508).
pub const FINE_MAX: usize = 508;
const FINE: usize = FINE_MAX.div_ceil(16);
/// The classes above [`FINE_MAX`]: mallocng's own (its `size_classes`, in
/// 16-byte units 36, 42, 50, 63, 72, 84, 102, 127, 146, 170, 204, 255).
const LARGE: [u16; 12] = [
    572, 668, 796, 1004, 1148, 1340, 1628, 2028, 2332, 2716, 3260, 4076,
];
/// The largest block the cache keeps, in bytes.
pub const SMALL_MAX: usize = LARGE[LARGE.len() - 1] as usize;
const CLASSES: usize = FINE + LARGE.len();
/// The most blocks cached per class and thread, up to [`FINE_MAX`] bytes.
pub const DEPTH: u32 = 32;
/// The most blocks cached per class and thread above [`FINE_MAX`] bytes.
pub const DEPTH_LARGE: u32 = 8;

/// The blocks of one class: a list threaded through the blocks themselves,
/// each holding the next one's address in its first 8 bytes (the smallest
/// class has 12).
#[derive(Clone, Copy)]
struct FreeList {
    head: *mut u8,
    len: u32,
}

impl FreeList {
    /// The block most recently pushed, if any.
    fn pop(&mut self) -> Option<*mut u8> {
        let block = self.head;
        if block.is_null() {
            return None;
        }
        // SAFETY: a block on a list is a `malloc`ed block of at least 12
        // bytes whose first 8 are the next one's address (`push`).
        self.head = unsafe { block.cast::<*mut u8>().read_unaligned() };
        self.len -= 1;
        Some(block)
    }

    /// Keeps `block`, unless the list holds `depth` already (false).
    ///
    /// # Safety
    /// `block` is a `malloc`ed block of at least 12 bytes that nothing else
    /// uses any more.
    unsafe fn push(&mut self, block: *mut u8, depth: u32) -> bool {
        if self.len >= depth {
            return false;
        }
        // SAFETY: as the caller's contract: room for an address.
        unsafe { block.cast::<*mut u8>().write_unaligned(self.head) };
        self.head = block;
        self.len += 1;
        true
    }
}

thread_local! {
    /// This thread's lists, one per class: null until [`cache_this_thread`]
    /// (a pointer, so that the threads without a cache, the init's, carry
    /// 8 bytes of it in their thread-local block, not the lists).
    static CACHE: Cell<*mut [FreeList; CLASSES]> = const { Cell::new(ptr::null_mut()) };
}

/// From now on, this thread keeps the blocks it frees for its next
/// allocations (the proxy's threads, `runtime.rs`). Its lists are allocated
/// once, from `malloc`; if that fails, the thread goes without.
pub fn cache_this_thread() {
    CACHE.with(|c| {
        if !c.get().is_null() {
            return;
        }
        let layout = Layout::new::<[FreeList; CLASSES]>();
        // SAFETY: a valid, non-zero-sized layout; the block is written whole
        // before it is published.
        unsafe {
            let lists = System.alloc(layout).cast::<[FreeList; CLASSES]>();
            if !lists.is_null() {
                lists.write(
                    [FreeList {
                        head: ptr::null_mut(),
                        len: 0,
                    }; CLASSES],
                );
                c.set(lists);
            }
        }
    });
}

/// This thread's cache off, and what it held back to `malloc`: for a thread
/// about to exit (tokio's `on_thread_stop` on the proxy's runtime, whose
/// blocking-pool threads come and go).
pub fn flush_this_thread() {
    let Ok(lists) = CACHE.try_with(|c| c.replace(ptr::null_mut())) else {
        return;
    };
    if lists.is_null() {
        return;
    }
    // SAFETY: the lists were this thread's and are unreachable now; each block
    // on them came from `malloc`, which frees it whatever the layout says.
    unsafe {
        for list in &mut *lists {
            while let Some(block) = list.pop() {
                System.dealloc(block, Layout::from_size_align_unchecked(1, 1));
            }
        }
        System.dealloc(lists.cast(), Layout::new::<[FreeList; CLASSES]>());
    }
}

/// The class of a layout the cache serves, `None` for others (larger, or
/// aligned beyond `malloc`'s 16 bytes).
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size();
    if size > SMALL_MAX || layout.align() > 16 {
        return None;
    }
    if size <= FINE_MAX {
        // 1..=12 → 0 (12 bytes), 13..=28 → 1 (28 bytes), ...
        return Some((size + 3) / 16);
    }
    LARGE
        .iter()
        .position(|&c| size <= usize::from(c))
        .map(|i| FINE + i)
}

/// The size of every block of class `c`, in bytes.
fn class_size(c: usize) -> usize {
    if c < FINE {
        16 * (c + 1) - 4
    } else {
        usize::from(LARGE[c - FINE])
    }
}

/// The layout every block of class `c` is allocated with.
/// (Aligned to 8 for the 12-byte class, so that `System` calls `malloc`, not
/// `posix_memalign`: `malloc` aligns every block to 16 on the targets drainit
/// ships, musl's and glibc's x86_64 and aarch64.)
fn class_layout(c: usize) -> Layout {
    let size = class_size(c);
    // SAFETY: 0 < size <= SMALL_MAX, and 8 and 16 are powers of two.
    unsafe { Layout::from_size_align_unchecked(size, if size < 16 { 8 } else { 16 }) }
}

/// Runs `f` on this thread's list of class `c`, if its cache is on (and the
/// thread-local still there).
fn with_list<R>(c: usize, f: impl FnOnce(&mut FreeList) -> R) -> Option<R> {
    let lists = CACHE.try_with(Cell::get).ok()?;
    if lists.is_null() {
        return None;
    }
    // SAFETY: the lists are this thread's (freed only by `flush_this_thread`,
    // which unpublishes them first), and `f` does not re-enter the allocator:
    // no other reference to them exists meanwhile.
    Some(f(unsafe { &mut (*lists)[c] }))
}

/// [`System`] (`malloc`), with the proxy threads' cache of small blocks.
pub struct Allocator;

// SAFETY: every block handed out is a `malloc`ed block at least as large as
// the layout asked for: a small layout's block is allocated at its class's
// full size (whether cached or not), and a block is on at most one list, of
// the thread that freed it. `free` takes any `malloc`ed block whatever its
// layout says.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(layout) else {
            // SAFETY: as the caller's contract.
            return unsafe { System.alloc(layout) };
        };
        let cached = with_list(c, FreeList::pop).flatten();
        // SAFETY: the class layout is valid and not zero-sized.
        cached.unwrap_or_else(|| unsafe { System.alloc(class_layout(c)) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(c) = class(layout) {
            let depth = if c < FINE { DEPTH } else { DEPTH_LARGE };
            // SAFETY: the block is the allocator's again, a `malloc`ed block
            // of at least its class's size (12 bytes or more).
            let kept = with_list(c, |list| unsafe { list.push(ptr, depth) });
            if kept == Some(true) {
                return;
            }
        }
        // SAFETY: `ptr` came from `malloc`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if class(layout).is_none() {
            // SAFETY: as the caller's contract.
            return unsafe { System.alloc_zeroed(layout) };
        }
        // SAFETY: as the caller's contract.
        let p = unsafe { self.alloc(layout) };
        if !p.is_null() {
            // SAFETY: the block has at least `layout.size()` bytes.
            unsafe { ptr::write_bytes(p, 0, layout.size()) };
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract makes this a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(layout), class(new)) {
            // Neither small: `realloc` itself.
            // SAFETY: as the caller's contract.
            (None, None) => unsafe { System.realloc(ptr, layout, new_size) },
            // The same class: the block has the room already.
            (Some(a), Some(b)) if a == b => ptr,
            // SAFETY: as the caller's contract; the bytes copied are in both
            // blocks.
            _ => unsafe {
                let moved = self.alloc(new);
                if !moved.is_null() {
                    ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                moved
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size up to the largest class has a class that holds it, and
    /// classes only grow.
    #[test]
    fn every_small_size_has_a_class_large_enough() {
        let mut last = 0;
        for size in 1..=SMALL_MAX {
            let c = class(Layout::from_size_align(size, 1).unwrap()).unwrap();
            assert!(
                class_size(c) >= size,
                "{size} bytes in a class of {}",
                class_size(c)
            );
            assert!(c >= last);
            last = c;
        }
        assert_eq!(
            class(Layout::from_size_align(SMALL_MAX + 1, 1).unwrap()),
            None
        );
        assert_eq!(class_size(0), 12);
        assert_eq!(last, CLASSES - 1);
    }

    /// Runs `f` on a thread of its own, its cache on if `cache`, with the
    /// allocator and a 24-byte layout (class 1).
    fn on_a_thread(cache: bool, f: impl FnOnce(&Allocator, Layout) + Send + 'static) {
        std::thread::spawn(move || {
            if cache {
                cache_this_thread();
            }
            f(&Allocator, Layout::from_size_align(24, 8).unwrap());
        })
        .join()
        .unwrap();
    }

    /// Allocates, writes, grows, shrinks and frees through [`Allocator`] on a
    /// thread with the cache on: blocks come back from the cache, hold what
    /// was written, and a full class goes to `malloc`.
    #[test]
    fn cached_blocks_are_reused_and_keep_their_contents() {
        on_a_thread(true, |a, small| {
            unsafe {
                let p = a.alloc(small);
                ptr::write_bytes(p, 0xab, 24);
                a.dealloc(p, small);
                // Same class (13..=28 bytes): the same block, from the cache.
                let q = a.alloc(Layout::from_size_align(28, 16).unwrap());
                assert_eq!(p, q);
                ptr::write_bytes(q, 7, 28);
                // Resized within its class: in place; beyond: moved, contents kept.
                assert_eq!(
                    a.realloc(q, Layout::from_size_align(28, 16).unwrap(), 26),
                    q
                );
                let big = a.realloc(q, Layout::from_size_align(26, 16).unwrap(), 8000);
                assert!((0..26).all(|i| *big.add(i) == 7));
                // Shrunk back into a class: a class-sized block, contents kept.
                let back = a.realloc(big, Layout::from_size_align(8000, 16).unwrap(), 20);
                assert!((0..20).all(|i| *back.add(i) == 7));
                a.dealloc(back, Layout::from_size_align(20, 16).unwrap());
                let z = a.alloc_zeroed(Layout::from_size_align(20, 4).unwrap());
                assert!((0..20).all(|i| *z.add(i) == 0));
                a.dealloc(z, Layout::from_size_align(20, 4).unwrap());
                // More than DEPTH freed: the class keeps DEPTH, the rest go.
                let many: Vec<*mut u8> = (0..DEPTH + 8).map(|_| a.alloc(small)).collect();
                for p in many {
                    a.dealloc(p, small);
                }
                assert_eq!(with_list(1, |l| l.len), Some(DEPTH));
                // Above 508 bytes, mallocng's classes: 700 and 790 bytes share
                // the one of 669..=796.
                let mid = Layout::from_size_align(700, 8).unwrap();
                let p = a.alloc(mid);
                a.dealloc(p, mid);
                assert_eq!(a.alloc(Layout::from_size_align(790, 8).unwrap()), p);
                a.dealloc(p, Layout::from_size_align(790, 8).unwrap());
                // Over-aligned and large layouts bypass the cache.
                let aligned = Layout::from_size_align(64, 64).unwrap();
                let p = a.alloc(aligned);
                assert_eq!(p as usize % 64, 0);
                a.dealloc(p, aligned);
            }
        });
    }

    /// A flushed thread's cache is off and empty: its next frees go to
    /// `malloc`.
    #[test]
    fn a_flushed_thread_keeps_nothing_more() {
        on_a_thread(true, |a, small| unsafe {
            let p = a.alloc(small);
            a.dealloc(p, small);
            assert_eq!(with_list(1, |l| l.len), Some(1));
            flush_this_thread();
            assert_eq!(with_list(1, |l| l.len), None);
            let q = a.alloc(small);
            a.dealloc(q, small);
            assert_eq!(with_list(1, |l| l.len), None);
        });
    }

    /// A thread that never turned its cache on frees straight to `malloc`.
    #[test]
    fn a_thread_without_the_cache_keeps_nothing() {
        on_a_thread(false, |a, small| {
            unsafe {
                let p = a.alloc(small);
                a.dealloc(p, small);
            }
            assert_eq!(with_list(1, |l| l.len), None);
        });
    }
}
