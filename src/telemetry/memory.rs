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

/// Make every thread allocate from one glibc arena (`M_ARENA_MAX` 1; elsewhere
/// nothing). Call it before the runtime's threads start.
///
/// glibc gives threads arenas of their own (up to 8 per core), and each keeps the
/// high-water mark of what was freed in it until the next [`release_freed`]: with
/// statuses of 1,500 entries arriving in bursts on two worker threads, the agent's peak
/// RSS was 49–50 MiB over a live heap of ~20 MiB (heaptrack); with one arena 42 MiB, and
/// 37 MiB resident after (bench/FINDINGS.md "2026-11-27 (seventh)"). The agent's threads
/// allocate little at a time (two workers, a few blocking tasks), so the shared arena's
/// lock costs nothing measurable (firewall edit 15 / 25 ms p50 / p99 either way).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn one_arena() {
    // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX takes any positive
    // count and applies to arenas created afterwards.
    let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) } == 1;
    if !set {
        tracing::debug!("M_ARENA_MAX not set: threads keep arenas of their own");
    }
}

/// Make every thread allocate from one arena (glibc; elsewhere nothing).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn one_arena() {}
