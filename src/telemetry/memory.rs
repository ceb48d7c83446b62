//! Giving freed heap back to the kernel after a burst.
//!
//! glibc keeps what was freed in its arenas and returns only the top of each: after the
//! first load (every manifest parsed at once, the whole table rendered) the process
//! would stay resident at that peak for as long as it runs, although most of it is free.
//! `malloc_trim(0)` walks the arenas and returns every free page (`madvise`), wherever
//! it lies.

/// Return the heap's free pages to the kernel (glibc; elsewhere nothing). Call it where
/// a burst has just ended (after the first sync, after a full replace): it walks and
/// locks every arena, which takes a few milliseconds on a large heap.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn release_freed() {
    // SAFETY: malloc_trim has no preconditions: it only hands free pages back.
    let released = unsafe { libc::malloc_trim(0) } != 0;
    tracing::debug!(released, "freed heap returned to the kernel");
}

/// Return the heap's free pages to the kernel (glibc; elsewhere nothing).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_freed() {}
