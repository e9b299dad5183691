//! Shared by the fuzz targets: an allocator that turns an allocation larger
//! than the input justifies into a crash, and small helpers.
//!
//! libFuzzer's own `-malloc_limit_mb` needs a sanitizer's allocator hooks,
//! which a stable build has not; this does the same, tighter: a target sets
//! a budget for the bytes in hand ([`budget`]) and any single allocation
//! above it aborts with a message naming its size, so a decoder that
//! reserves from a count read off the wire is found even when the
//! reservation would have succeeded.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The largest single allocation allowed now (`usize::MAX` = no limit).
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The global allocator of every fuzz target.
pub struct Budgeted;

#[global_allocator]
static ALLOC: Budgeted = Budgeted;

#[cold]
fn over_budget(size: usize, limit: usize) -> ! {
    // No allocation from here on: a fixed buffer, written once, then abort
    // (libFuzzer reports the deadly signal and saves the input).
    LIMIT.store(usize::MAX, Ordering::Relaxed);
    let mut buf = [0u8; 160];
    let mut w = &mut buf[..];
    let _ = write!(
        w,
        "\n==rokka-fuzz== allocation of {size} bytes exceeds the budget of {limit} bytes for this input\n"
    );
    let left = w.len();
    let n = buf.len() - left;
    let _ = std::io::stderr().write_all(&buf[..n]);
    std::process::abort();
}

#[inline]
fn check(size: usize) {
    let limit = LIMIT.load(Ordering::Relaxed);
    // A panic being reported (its message, a backtrace) is not the input's
    // allocation: the panic itself is the crash.
    if size > limit && !std::thread::panicking() {
        over_budget(size, limit);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// check before it never allocates.
unsafe impl GlobalAlloc for Budgeted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// While alive, a single allocation above the budget aborts.
pub struct Budget(());

impl Drop for Budget {
    fn drop(&mut self) {
        LIMIT.store(usize::MAX, Ordering::Relaxed);
    }
}

/// Limits single allocations to `fixed + per_byte × input_len` bytes until
/// the returned guard drops.
pub fn budget(input_len: usize, fixed: usize, per_byte: usize) -> Budget {
    LIMIT.store(
        fixed.saturating_add(per_byte.saturating_mul(input_len)),
        Ordering::Relaxed,
    );
    Budget(())
}

/// Reads bytes off the front of a fuzz input, zeros once it runs out.
pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn rest(self) -> &'a [u8] {
        self.0
    }
}
