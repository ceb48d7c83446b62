//! The policy generation of verified connections ([`crate::nft::verified`]): which
//! value the next change of the table carries, and clearing values from the conntrack
//! marks before they are used again.
//!
//! The values cycle through three groups ([`crate::nft::verified::groups`]). When a
//! change makes the first value of a group current, the entries still marked with a
//! value of the next group (verified under a policy a whole group of changes old) are
//! cleared in the background, in one walk of the conntrack table; the change that
//! first uses that group waits for it. Nothing but the marking rule of the current
//! value sets a value, so when a value becomes current again, no connection carries it
//! from before.
//!
//! At start nothing is current (the first table verifies nothing, so the table an
//! older egressd left marks nothing once it is replaced), then every group is cleared,
//! then the first value is stamped. If clearing fails (no ctnetlink), the fast path
//! stays off: every packet walks the rules, as with a mask of 0.

use std::io;
use std::sync::mpsc;

use crate::nft::verified::Group;

/// Clears generations from the conntrack marks.
pub trait Sweep: Send + 'static {
    /// Clear the bits `clear` of every entry whose mark is in `group`; how many it
    /// found.
    fn sweep(&mut self, group: Group, clear: u32) -> io::Result<usize>;
}

impl<F: FnMut(Group, u32) -> io::Result<usize> + Send + 'static> Sweep for F {
    fn sweep(&mut self, group: Group, clear: u32) -> io::Result<usize> {
        self(group, clear)
    }
}

/// The kernel's conntrack table, over ctnetlink.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conntrack;

impl Sweep for Conntrack {
    fn sweep(&mut self, group: Group, clear: u32) -> io::Result<usize> {
        super::conntrack::clear_marks(group.mask, group.value, clear)
    }
}

/// Lower the calling thread's priority to the least (nice 19). A clearing walks the
/// kernel's whole conntrack hash (~10 ms of a core) ahead of the change that needs it:
/// background work, which must not delay a sync (nor the node's pods) when the cores
/// are busy. With 100 agents on one kernel (bench/cluster-scale.sh) their walks came
/// at the same moment as their syncs: 12 % of the machine while EgressIPs were placed.
#[allow(unsafe_code)]
fn background() {
    // SAFETY: setpriority takes plain integers and touches no memory of ours; on Linux
    // PRIO_PROCESS with a thread id sets that thread's nice value only.
    let done = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    if done != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "the conntrack clearing thread keeps its priority");
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing cleared yet: changes carry no value.
    Fresh,
    /// Groups cleared: changes carry the next value.
    Running,
    /// A clearing failed: changes carry no value, for good.
    Off,
}

/// The generations of one table.
pub struct Generations {
    mask: u32,
    /// The values in the order they are used, and their group's index.
    values: Vec<(u32, usize)>,
    groups: Vec<Group>,
    state: State,
    /// The value the applied table carries.
    current: Option<u32>,
    /// Groups cleared and not used since.
    clean: Vec<bool>,
    /// The group whose clearing was asked for and not yet waited for.
    pending: Option<usize>,
    requests: mpsc::Sender<Group>,
    done: mpsc::Receiver<(Group, io::Result<usize>)>,
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
        let (requests, work) = mpsc::channel::<Group>();
        let (report, done) = mpsc::channel();
        let spawned = std::thread::Builder::new().name("egressd-ct-sweep".into()).spawn(move || {
            background();
            for group in work {
                if report.send((group, sweeper.sweep(group, mask))).is_err() {
                    break;
                }
            }
        });
        let split = crate::nft::verified::groups(mask);
        let groups: Vec<Group> = split.iter().map(|(g, _)| *g).collect();
        let values: Vec<(u32, usize)> =
            split.iter().enumerate().flat_map(|(i, (_, values))| values.iter().map(move |v| (*v, i))).collect();
        let state = if spawned.is_ok() && values.len() >= 3 { State::Fresh } else { State::Off };
        let clean = vec![false; groups.len()];
        Self { mask, values, groups, state, current: None, clean, pending: None, requests, done }
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
        Some(self.values[self.after(self.current)].0)
    }

    /// The index of the value after `value` (the first after none).
    fn after(&self, value: Option<u32>) -> usize {
        value.and_then(|v| self.values.iter().position(|x| x.0 == v)).map_or(0, |i| (i + 1) % self.values.len())
    }

    /// The group `value` opens, if it is the first of its group.
    fn opens(&self, value: u32) -> Option<usize> {
        let i = self.values.iter().position(|x| x.0 == value)?;
        let group = self.values[i].1;
        (i == 0 || self.values[i - 1].1 != group).then_some(group)
    }

    /// Make sure `value` is cleared: the first value of a group waits for the group's
    /// clearing (asked for when the group before it began); false when that failed (the
    /// fast path is then off).
    pub fn ready(&mut self, value: u32) -> bool {
        if self.state != State::Running {
            return false;
        }
        let Some(group) = self.opens(value) else { return true };
        if !self.clean[group] && self.pending == Some(group) {
            self.pending = None;
            self.wait(group);
        }
        if !self.clean[group] && self.state == State::Running {
            self.fail(self.groups[group], &io::Error::other("its clearing was never asked for"));
        }
        self.state == State::Running
    }

    /// Wait for the clearing of `group` (and any asked before it).
    fn wait(&mut self, group: usize) {
        loop {
            match self.done.recv() {
                Ok((g, Ok(_))) => {
                    let Some(i) = self.groups.iter().position(|x| *x == g) else { continue };
                    self.clean[i] = true;
                    if i == group {
                        return;
                    }
                }
                Ok((g, Err(e))) => return self.fail(g, &e),
                Err(_) => return self.fail(self.groups[group], &io::Error::other("the clearing thread is gone")),
            }
        }
    }

    fn fail(&mut self, group: Group, e: &io::Error) {
        tracing::warn!(
            error = %e,
            marks = format_args!("{:#010x}/{:#010x}", group.value, group.mask),
            "cannot clear verified connections' marks; the firewall's fast path is off (every packet walks the rules)"
        );
        self.state = State::Off;
    }

    /// A table carrying `value` was applied: it is current; if it begins a group, the
    /// next group is cleared in the background. The first table applied (carrying
    /// none) has every group cleared, right away: then [`Generations::upcoming`] gives
    /// the first value, and this returns true (the first value is due now).
    pub fn applied(&mut self, value: Option<u32>) -> bool {
        match self.state {
            State::Off => false,
            State::Fresh => {
                for i in 0..self.groups.len() {
                    if self.requests.send(self.groups[i]).is_err() {
                        self.fail(self.groups[i], &io::Error::other("the clearing thread is gone"));
                        return false;
                    }
                    self.wait(i);
                    if self.state == State::Off {
                        return false;
                    }
                }
                self.state = State::Running;
                self.current = None;
                tracing::info!(
                    mask = format_args!("{:#010x}", self.mask),
                    generations = self.values.len(),
                    "verified connections: the firewall's fast path is on"
                );
                true
            }
            State::Running => {
                self.current = value;
                let Some(group) = value.and_then(|v| self.opens(v)) else { return false };
                self.clean[group] = false;
                let next = (group + 1) % self.groups.len();
                if self.pending.is_none() && self.requests.send(self.groups[next]).is_ok() {
                    self.clean[next] = false;
                    self.pending = Some(next);
                }
                false
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
        (seen, move |group: Group, _clear: u32| {
            log.lock().unwrap().push(group.value);
            Ok(0)
        })
    }

    /// Drive `changes` changes; the values used.
    fn run(g: &mut Generations, changes: usize) -> Vec<u32> {
        let mut used = Vec::new();
        for _ in 0..changes {
            let v = g.upcoming().unwrap();
            assert!(g.ready(v));
            g.applied(Some(v));
            assert_eq!(g.current(), Some(v));
            used.push(v);
        }
        used
    }

    #[test]
    fn every_value_is_cleared_before_it_is_current_again() {
        let (seen, sweeper) = recording();
        let mut g = Generations::new(0x0300_0000, sweeper);
        assert_eq!(g.upcoming(), None, "nothing before the first clearing");
        g.applied(None);
        assert_eq!(*seen.lock().unwrap(), [0x0100_0000, 0x0200_0000, 0x0300_0000]);
        seen.lock().unwrap().clear();
        // Two bits: each value is a group; ten changes.
        let used = run(&mut g, 10);
        assert_eq!(&used[..4], [0x0100_0000, 0x0200_0000, 0x0300_0000, 0x0100_0000]);
        g.ready(g.upcoming().unwrap());
        // The clearing asked after using used[i] is of used[i + 1].
        let cleared = seen.lock().unwrap().clone();
        assert_eq!(cleared, used[1..].iter().copied().chain([g.upcoming().unwrap()]).collect::<Vec<_>>());
    }

    #[test]
    fn clearings_run_at_the_lowest_priority() {
        // The nice value of the thread that clears (field 19 of its stat; the command
        // name in parentheses comes before).
        let nice = Arc::new(Mutex::new(Vec::new()));
        let log = nice.clone();
        let mut g = Generations::new(0x0300_0000, move |_: Group, _: u32| {
            let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
            let value: i32 = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(16))
                .map_or(Err(io::Error::other("no nice field")), |f| f.parse().map_err(io::Error::other))?;
            log.lock().unwrap().push(value);
            Ok(0)
        });
        g.applied(None);
        assert!(!g.is_off());
        assert_eq!(*nice.lock().unwrap(), [19, 19, 19]);
        let own = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        assert_ne!(own.rsplit_once(')').unwrap().1.split_whitespace().nth(16), Some("19"), "the caller keeps its own");
    }

    #[test]
    fn four_bits_clear_a_group_of_four_values_in_one_walk() {
        let (seen, sweeper) = recording();
        let mut g = Generations::new(0x0f00_0000, sweeper);
        g.applied(None);
        assert_eq!(*seen.lock().unwrap(), [0x0400_0000, 0x0800_0000, 0x0c00_0000]);
        seen.lock().unwrap().clear();
        let used = run(&mut g, 24);
        assert_eq!(&used[..5], [0x0400_0000, 0x0500_0000, 0x0600_0000, 0x0700_0000, 0x0800_0000]);
        assert_eq!(used[12], used[0], "twelve generations");
        g.ready(g.upcoming().unwrap());
        // One walk per four changes, each of the group after the one just begun.
        let cleared = seen.lock().unwrap().clone();
        assert_eq!(cleared, [0x0800_0000, 0x0c00_0000, 0x0400_0000, 0x0800_0000, 0x0c00_0000, 0x0400_0000]);
        // Each group was cleared after its last use and before its next.
        for (i, v) in used.iter().enumerate().skip(4).step_by(4) {
            let group = v & 0x0c00_0000;
            let walk = i / 4 - 1;
            assert_eq!(cleared[walk], group, "change {i}");
        }
    }

    #[test]
    fn a_failed_clearing_turns_the_fast_path_off() {
        let mut g = Generations::new(0x0300_0000, |_: Group, _: u32| Err(io::Error::other("no ctnetlink")));
        g.applied(None);
        assert!(g.is_off());
        assert_eq!(g.upcoming(), None);
        let mut calls = 0;
        let mut g = Generations::new(0x0300_0000, move |_: Group, _: u32| {
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
