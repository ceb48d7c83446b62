//! The policy generation of verified connections ([`crate::nft::verified`]): which
//! value the next change of the table carries, and clearing a value from the conntrack
//! marks before it is used again.
//!
//! The values cycle. Right after a change makes value `v` current, the entries still
//! marked with the value after `v` (verified under a policy two or more changes old)
//! are cleared in the background; the change that uses that value waits for it first.
//! Nothing but the marking rule of the current value sets a value, so when a value
//! becomes current again, no connection carries it from before.
//!
//! At start nothing is current (the first table verifies nothing, so the table an
//! older egressd left marks nothing once it is replaced), then every value is cleared,
//! then the first value is stamped. If clearing fails (no ctnetlink), the fast path
//! stays off: every packet walks the rules, as with a mask of 0.

use std::io;
use std::sync::mpsc;

/// Clears a generation from the conntrack marks.
pub trait Sweep: Send + 'static {
    /// Clear the bits `mask` of every entry whose mark under `mask` is `value`; how
    /// many it found.
    fn sweep(&mut self, mask: u32, value: u32) -> io::Result<usize>;
}

impl<F: FnMut(u32, u32) -> io::Result<usize> + Send + 'static> Sweep for F {
    fn sweep(&mut self, mask: u32, value: u32) -> io::Result<usize> {
        self(mask, value)
    }
}

/// The kernel's conntrack table, over ctnetlink.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conntrack;

impl Sweep for Conntrack {
    fn sweep(&mut self, mask: u32, value: u32) -> io::Result<usize> {
        super::conntrack::clear_marks(mask, value)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No value cleared yet: changes carry none.
    Fresh,
    /// Values cleared: changes carry the next one.
    Running,
    /// A clearing failed: changes carry none, for good.
    Off,
}

/// The generations of one table.
pub struct Generations {
    mask: u32,
    values: Vec<u32>,
    state: State,
    /// The value the applied table carries.
    current: Option<u32>,
    /// The value whose clearing was asked for and not yet waited for.
    pending: Option<u32>,
    requests: mpsc::Sender<u32>,
    done: mpsc::Receiver<(u32, io::Result<usize>)>,
}

impl std::fmt::Debug for Generations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generations")
            .field("mask", &format_args!("{:#010x}", self.mask))
            .field("state", &self.state)
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl Generations {
    /// Generations in the conntrack mark bits `mask` (checked by
    /// [`crate::nft::verified::check_mask`]), cleared by `sweeper` on a thread of its own.
    pub fn new(mask: u32, mut sweeper: impl Sweep) -> Self {
        let (requests, work) = mpsc::channel::<u32>();
        let (report, done) = mpsc::channel();
        let spawned = std::thread::Builder::new().name("egressd-ct-sweep".into()).spawn(move || {
            for value in work {
                if report.send((value, sweeper.sweep(mask, value))).is_err() {
                    break;
                }
            }
        });
        let values: Vec<u32> = crate::nft::verified::values(mask).collect();
        let state = if spawned.is_ok() && values.len() >= 3 { State::Fresh } else { State::Off };
        Self { mask, values, state, current: None, pending: None, requests, done }
    }

    /// Whether the fast path is off for good (a clearing failed).
    pub fn is_off(&self) -> bool {
        self.state == State::Off
    }

    /// The value the applied table carries.
    pub fn current(&self) -> Option<u32> {
        self.current
    }

    /// The value the next change carries (none before the first clearing and after a
    /// failed one).
    pub fn upcoming(&self) -> Option<u32> {
        if self.state != State::Running {
            return None;
        }
        Some(self.after(self.current))
    }

    fn after(&self, value: Option<u32>) -> u32 {
        let at =
            value.and_then(|v| self.values.iter().position(|x| *x == v)).map_or(0, |i| (i + 1) % self.values.len());
        self.values[at]
    }

    /// Wait until `value` is cleared (its clearing was asked for after the change
    /// before); false when that failed (the fast path is then off).
    pub fn ready(&mut self, value: u32) -> bool {
        if self.state != State::Running {
            return false;
        }
        if self.pending == Some(value) {
            self.pending = None;
            if !self.wait(value) {
                return false;
            }
        }
        true
    }

    fn wait(&mut self, value: u32) -> bool {
        loop {
            match self.done.recv() {
                Ok((v, Ok(_))) if v == value => return true,
                Ok((_, Ok(_))) => {}
                Ok((v, Err(e))) => {
                    self.fail(v, &e);
                    return false;
                }
                Err(_) => {
                    self.fail(value, &io::Error::other("the clearing thread is gone"));
                    return false;
                }
            }
        }
    }

    fn fail(&mut self, value: u32, e: &io::Error) {
        tracing::warn!(
            error = %e,
            mark = format_args!("{value:#010x}"),
            "cannot clear verified connections' marks; the firewall's fast path is off (every packet walks the rules)"
        );
        self.state = State::Off;
    }

    /// A table carrying `value` was applied: it is current, and the value after it is
    /// cleared in the background. The first table applied (carrying none) has every
    /// value cleared, right away: then [`Generations::upcoming`] gives the first.
    pub fn applied(&mut self, value: Option<u32>) {
        match self.state {
            State::Off => {}
            State::Fresh => {
                for v in self.values.clone() {
                    if self.requests.send(v).is_err() || !self.wait(v) {
                        return;
                    }
                }
                self.state = State::Running;
                self.current = None;
                tracing::info!(
                    mask = format_args!("{:#010x}", self.mask),
                    "verified connections: the firewall's fast path is on"
                );
            }
            State::Running => {
                self.current = value;
                let next = self.after(value);
                if self.pending.is_none() && self.requests.send(next).is_ok() {
                    self.pending = Some(next);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn recording() -> (Arc<Mutex<Vec<u32>>>, impl Sweep) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        (seen, move |_mask: u32, value: u32| {
            log.lock().unwrap().push(value);
            Ok(0)
        })
    }

    #[test]
    fn every_value_is_cleared_before_it_is_current_again() {
        let (seen, sweeper) = recording();
        let mut g = Generations::new(0x0300_0000, sweeper);
        assert_eq!(g.upcoming(), None, "nothing before the first clearing");
        g.applied(None);
        assert_eq!(*seen.lock().unwrap(), [0x0100_0000, 0x0200_0000, 0x0300_0000]);
        seen.lock().unwrap().clear();
        // Ten changes: each value, before it is used, cleared after the last time it was.
        let mut used = Vec::new();
        for _ in 0..10 {
            let v = g.upcoming().unwrap();
            assert!(g.ready(v));
            g.applied(Some(v));
            assert_eq!(g.current(), Some(v));
            used.push(v);
        }
        assert_eq!(&used[..4], [0x0100_0000, 0x0200_0000, 0x0300_0000, 0x0100_0000]);
        g.ready(g.upcoming().unwrap());
        let cleared = seen.lock().unwrap().clone();
        // The clearing asked after using used[i] is of used[i + 1].
        assert_eq!(cleared, used[1..].iter().copied().chain([g.upcoming().unwrap()]).collect::<Vec<_>>());
    }

    #[test]
    fn a_failed_clearing_turns_the_fast_path_off() {
        let mut g = Generations::new(0x0300_0000, |_: u32, _: u32| Err(io::Error::other("no ctnetlink")));
        g.applied(None);
        assert!(g.is_off());
        assert_eq!(g.upcoming(), None);
        let mut calls = 0;
        let mut g = Generations::new(0x0300_0000, move |_: u32, _: u32| {
            calls += 1;
            if calls > 3 { Err(io::Error::other("gone")) } else { Ok(0) }
        });
        g.applied(None);
        let v = g.upcoming().unwrap();
        assert!(g.ready(v));
        g.applied(Some(v));
        let next = g.upcoming().unwrap();
        assert!(!g.ready(next), "its clearing failed");
        assert!(g.is_off());
        assert_eq!(g.upcoming(), None);
    }
}
