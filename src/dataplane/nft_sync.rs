//! The nftables driver: [`NftSyncer`] keeps the kernel's table equal to the desired one
//! through an [`NftBackend`].
//!
//! The agent's backend is [`super::nft_cli::NftCli`]: every transaction over in-process
//! nf_tables netlink ([`crate::dataplane::elements`]), the `nft` program
//! ([`super::nft_run`]) for what the kernel refuses there and with `--nft-transport nft`.
//! Measured on the project's machines (`bench/RESULTS.md` and `bench/`): a small delta
//! through `nft` costs ~5–7 ms of process start plus nft reading the whole table into
//! its cache before each transaction (tens of ms at 100k rules); the netlink path costs
//! the kernel's commit only. Text is what `egressd render` shows and what the `nft`
//! fallback applies; the tests compare the netlink path with it.
//!
//! Guarantees of [`NftSyncer::sync`]:
//! * The first sync (and any sync after a failure) replaces the whole table: packets
//!   meet the old table or the new one, never a mix, never a moment without policy. A
//!   table that exists is replaced in one transaction. Over netlink, one the kernel
//!   does not have yet is created in stages of ~1 MiB, its base chains last, so no
//!   packet enters it before all of it is there
//!   ([`super::elements::ElementWriter::replace`]; a 100k-rule transaction held whole
//!   was the agent's peak memory).
//! * Later syncs send only the difference ([`crate::nft::diff`] or, for elements only,
//!   [`ElementDelta`]), in one transaction.
//! * The same desired table twice sends nothing.
//! * A failed delta is retried at once as a full replace.
//!
//! Assumptions: nothing but egressd changes its table; when something does, the drift
//! watch ([`crate::dataplane::drift`]) has the agent call [`NftSyncer::force_full`].
//! Every `nft` run is bounded by [`super::nft_run::NFT_TIMEOUT`]. Caveat: a full replace resets
//! the rule counters.

use super::elements::Element;
use super::nft_run::NftError;
use crate::nft::delta::ElementDelta;
use crate::nft::{Comparison, Table, diff};

/// How a transaction reached the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// An `nft` process.
    Nft,
    /// This process, over netlink (counted in [`super::elements::own_commits`]).
    Netlink,
}

/// Something that applies an nft script atomically.
pub trait NftBackend: Send {
    /// Apply `script` as one transaction.
    fn apply(&mut self, script: &str) -> Result<(), NftError>;

    /// Apply element changes to table `table` as one transaction (by default as the
    /// script [`ElementDelta::script`] renders).
    fn apply_elements(&mut self, table: &str, delta: &ElementDelta) -> Result<(), NftError> {
        self.apply(&delta.script(table))
    }

    /// Replace the kernel's table of this name with `table` and add the elements
    /// `kept` (what DNS snooping learned), and say how it went. By default the script
    /// [`Table::replace_script`] renders, then the kept elements as a second
    /// transaction.
    fn replace(&mut self, table: &Table, kept: &[Element]) -> Result<Transport, NftError> {
        replace_by_script(self, table, kept)
    }

    /// Change the kernel's table from `c.old` (what it holds) into `c.new` as one
    /// transaction (by default with the script [`diff`] renders).
    fn apply_changes(&mut self, c: &Comparison<'_>) -> Result<(), NftError> {
        match diff(c.old, c.new) {
            Some(script) => self.apply(&script),
            None => Ok(()),
        }
    }

    /// The packet counts of the named counters of `table` (none by default).
    fn counters(&mut self, _table: &str) -> Result<Vec<(String, u64)>, NftError> {
        Ok(Vec::new())
    }

    /// The per-rule counters of `chain` of `table` (none by default).
    fn rule_counters(
        &mut self,
        _table: &str,
        _chain: &str,
    ) -> Result<Vec<super::rule_counters::RuleCounter>, NftError> {
        Ok(Vec::new())
    }
}

/// A full replace through `backend`'s scripts: [`Table::replace_script`], then the
/// `kept` elements as a second transaction (the default of [`NftBackend::replace`] and
/// the `nft` fallback of the netlink one).
pub(super) fn replace_by_script<B: NftBackend + ?Sized>(
    backend: &mut B,
    table: &Table,
    kept: &[Element],
) -> Result<Transport, NftError> {
    backend.apply(&table.replace_script())?;
    if !kept.is_empty() {
        let delta = ElementDelta { delete: Vec::new(), add: super::elements::by_set(kept) };
        backend.apply_elements(&table.name, &delta)?;
    }
    Ok(Transport::Nft)
}

/// Records scripts instead of applying them (unit tests). Fails the next
/// `fail_next` calls with the given message.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct RecordingBackend {
    /// Every script received, applied or not.
    pub(crate) scripts: Vec<String>,
    /// How many of the next calls fail.
    pub(crate) fail_next: usize,
}

#[cfg(test)]
impl NftBackend for RecordingBackend {
    // Element changes are recorded as the script they render (the default).
    fn apply(&mut self, script: &str) -> Result<(), NftError> {
        self.scripts.push(script.to_string());
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return Err(NftError::Rejected { message: "Error: injected failure".into() });
        }
        Ok(())
    }
}

/// Hooks around a full replace: the drift watch stops listening to nf_tables
/// notifications for its duration (the kernel builds one per rule and set element for
/// every listener) and checks the ruleset's generation afterwards instead
/// ([`crate::dataplane::drift`]).
pub trait QuietReplace: Send {
    /// Before the replace; what [`QuietReplace::after`] needs (`None`: stay listening).
    fn before(&mut self) -> Option<(u32, u64)>;
    /// After it; `committed` when a transaction the netlink commit count does not
    /// include (an `nft` process's) applied.
    fn after(&mut self, before: Option<(u32, u64)>, committed: bool);
}

/// What a sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// Nothing to send.
    Unchanged,
    /// A delta transaction.
    Partial,
    /// A full replace.
    Full,
}

/// Keeps the applied table in memory and sends differences.
pub struct NftSyncer<B> {
    backend: B,
    /// Shared with the agent's copy of what it applied: keeping it costs no copy.
    applied: Option<std::sync::Arc<Table>>,
    /// How long the last [`NftSyncer::sync`] spent in the backend (the `nft` program and
    /// the kernel), as opposed to egressd's own diff and rendering.
    backend_time: std::time::Duration,
    /// Around full replaces, when the drift watch runs.
    quiet: Option<Box<dyn QuietReplace>>,
    /// The verified connections' policy generation every change moves (none: the
    /// tables' `fw-epoch` stays empty, nothing is verified).
    generations: Option<super::verified::Generations>,
}

impl<B: std::fmt::Debug> std::fmt::Debug for NftSyncer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftSyncer")
            .field("backend", &self.backend)
            .field("applied", &self.applied.as_ref().map(|t| t.name.as_str()))
            .field("quiet", &self.quiet.is_some())
            .field("generations", &self.generations)
            .finish_non_exhaustive()
    }
}

impl<B: NftBackend> NftSyncer<B> {
    /// A syncer that has applied nothing yet (its first sync is a full replace).
    pub fn new(backend: B) -> Self {
        Self { backend, applied: None, backend_time: std::time::Duration::ZERO, quiet: None, generations: None }
    }

    /// Move the verified connections' generation with every change
    /// ([`crate::nft::verified`]).
    pub fn set_generations(&mut self, generations: super::verified::Generations) {
        self.generations = Some(generations);
    }

    /// Run full replaces between these hooks (the drift watch's).
    pub(crate) fn set_quiet(&mut self, quiet: Box<dyn QuietReplace>) {
        self.quiet = Some(quiet);
    }

    /// The backend (tests inspect the recording backend).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably.
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// The table last applied successfully.
    #[cfg(test)]
    pub(crate) fn applied(&self) -> Option<&Table> {
        self.applied.as_deref()
    }

    /// How long the last [`NftSyncer::sync`] spent in the backend.
    pub fn backend_time(&self) -> std::time::Duration {
        self.backend_time
    }

    /// Make the kernel's table equal `desired` (kept as what is applied: an `Arc`
    /// shared with the caller is kept without a copy).
    pub fn sync(&mut self, desired: impl Into<std::sync::Arc<Table>>) -> Result<SyncKind, NftError> {
        self.sync_keeping(&mut desired.into(), Vec::new)
    }

    /// [`NftSyncer::sync`], where a full replace also adds the elements `kept` gives
    /// (what DNS snooping learned, which the table does not hold) in the same
    /// transaction (over netlink; through `nft`, right after it). A change that only a
    /// full replace makes (see [`Comparison::needs_replace`]) is one, reported `Full`.
    ///
    /// With [`NftSyncer::set_generations`], `desired` is stamped with the verified
    /// connections' generation it applies: the next one, in the change's own
    /// transaction, when the change touches what decides the fast path's verdicts; the
    /// applied one when it changes only parts verified connections walk anyway
    /// ([`crate::nft::verified::outside`]). A table equal to the applied one but for
    /// that stamp is unchanged, and `desired` becomes the applied table.
    pub fn sync_keeping(
        &mut self,
        desired: &mut std::sync::Arc<Table>,
        kept: impl FnOnce() -> Vec<Element>,
    ) -> Result<SyncKind, NftError> {
        self.backend_time = std::time::Duration::ZERO;
        use crate::nft::verified;
        let mut generation = self.generations.as_ref().and_then(super::verified::Generations::upcoming);
        stamp(desired, generation);
        // One comparison of the two tables decides and builds the sync.
        let mut c = self.applied.as_deref().map(|applied| Comparison::of(applied, desired));
        if c.as_ref()
            .is_some_and(|c| c.is_empty() || (verified::stamped(c.old).is_some() && c.only_sets(verified::EPOCH_SET)))
        {
            drop(c);
            if let Some(applied) = &self.applied {
                *desired = applied.clone();
            }
            return Ok(SyncKind::Unchanged);
        }
        // A change of what verified connections walk anyway (EgressIP, EgressQoS) keeps
        // the applied generation: their verdicts stand, and no clearing is spent on it.
        let keeps = c.as_ref().and_then(|c| {
            let current = verified::stamped(c.old)?;
            let walked_anyway = |name: &str| name == verified::EPOCH_SET || verified::outside(name);
            (generation.is_some() && c.only_names(walked_anyway)).then_some(current)
        });
        if let Some(current) = keeps {
            drop(c);
            generation = Some(current);
            stamp(desired, generation);
            c = self.applied.as_deref().map(|applied| Comparison::of(applied, desired));
        } else if let Some(g) = generation
            && self.generations.as_mut().is_some_and(|gens| !gens.ready(g))
        {
            // The generation could not be cleared: the fast path is off from now on.
            drop(c);
            return self.sync_keeping(desired, kept);
        }
        let kind = 'sent: {
            if let Some(c) = c {
                let elements = ElementDelta::of_elements(&c);
                let t = std::time::Instant::now();
                let applied = match elements {
                    Some(delta) => Some(self.backend.apply_elements(&desired.name, &delta)),
                    None if c.needs_replace() => None,
                    None => Some(self.backend.apply_changes(&c)),
                };
                self.backend_time += t.elapsed();
                match applied {
                    None => {}
                    Some(Ok(())) => break 'sent SyncKind::Partial,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "partial nft update failed; replacing the whole table");
                        self.applied = None;
                    }
                }
            }
            let t = std::time::Instant::now();
            let quiet = self.quiet.as_mut().and_then(|q| q.before());
            let applied = self.backend.replace(desired, &kept());
            if let Some(q) = self.quiet.as_mut() {
                q.after(quiet, matches!(applied, Ok(Transport::Nft)));
            }
            self.backend_time += t.elapsed();
            applied?;
            SyncKind::Full
        };
        self.applied = Some(desired.clone());
        if keeps.is_none() && self.generations.as_mut().is_some_and(|gens| gens.applied(generation)) {
            // The first table verified nothing; every value is cleared now: the first
            // generation goes in at once (an element change).
            let time = self.backend_time;
            let mut stamped = desired.clone();
            self.sync_keeping(&mut stamped, Vec::new)?;
            self.backend_time += time;
            *desired = stamped;
        }
        Ok(kind)
    }

    /// The packet counts of the applied table's named counters.
    pub fn counters(&mut self) -> Result<Vec<(String, u64)>, NftError> {
        let Some(name) = self.applied.as_ref().map(|t| t.name.clone()) else { return Ok(Vec::new()) };
        self.backend.counters(&name)
    }

    /// The per-rule counters of `chain` of the applied table.
    pub fn rule_counters(&mut self, chain: &str) -> Result<Vec<super::rule_counters::RuleCounter>, NftError> {
        let Some(name) = self.applied.as_ref().map(|t| t.name.clone()) else { return Ok(Vec::new()) };
        self.backend.rule_counters(&name, chain)
    }

    /// Re-add every element of `slots` as applied, which restarts their kernel
    /// timeouts (re-adding an existing element updates its timeout). Slots without
    /// applied elements are skipped. On failure the next
    /// sync is a full replace.
    pub fn refresh_timeouts(&mut self, slots: &[crate::nft::Slot]) -> Result<bool, NftError> {
        let Some(applied) = &self.applied else { return Ok(false) };
        let Some(delta) = ElementDelta::refresh(applied, slots) else {
            // Elements the compiler did not write in canonical form: a full replace
            // (next sync) sets every timeout afresh.
            self.applied = None;
            return Ok(false);
        };
        if delta.is_empty() {
            return Ok(false);
        }
        let name = applied.name.clone();
        if let Err(e) = self.backend.apply_elements(&name, &delta) {
            self.applied = None;
            return Err(e);
        }
        Ok(true)
    }

    /// Forget what was applied: the next sync is a full replace (someone else changed
    /// the table).
    pub(crate) fn force_full(&mut self) {
        self.applied = None;
    }

    /// Remove the table (and everything in it). Safe when it does not exist.
    pub fn delete(&mut self, table_name: &str) -> Result<(), NftError> {
        self.backend.apply(&Table::delete_script(table_name))?;
        self.applied = None;
        Ok(())
    }
}

/// Stamp `table` with the verified connections' generation `value`, unless it holds it
/// (or has no `fw-epoch` set): a table the caller alone holds is changed in place.
fn stamp(table: &mut std::sync::Arc<Table>, value: Option<u32>) {
    use crate::nft::verified;
    if table.sets.contains_key(verified::EPOCH_SET) && verified::stamped(table) != value {
        verified::stamp(std::sync::Arc::make_mut(table), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::{Chain, KeyType, Set};
    use std::time::Duration;

    fn table(n: usize) -> Table {
        let mut t = Table::new("egressd");
        let mut s = Set::new(KeyType::Ipv4, false);
        for i in 0..n {
            s.elements.insert(format!("198.18.0.{i}").parse().unwrap(), Default::default());
        }
        t.sets.insert("s".into(), s);
        t.chains.insert("c".into(), Chain::parsed(["counter accept"]).unwrap());
        t
    }

    /// How many clearings were swept, once at least `at_least` were and no other
    /// followed for a moment (they run on a thread of their own).
    fn settled(swept: &std::sync::Mutex<Vec<u32>>, at_least: usize) -> usize {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while swept.lock().unwrap().len() < at_least && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        swept.lock().unwrap().len()
    }

    /// A syncer with three generations (two bits); the groups its clearings swept.
    fn with_generations() -> (NftSyncer<RecordingBackend>, std::sync::Arc<std::sync::Mutex<Vec<u32>>>) {
        let swept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = swept.clone();
        let mut s = NftSyncer::new(RecordingBackend::default());
        s.set_generations(super::super::verified::Generations::new(
            0x0300_0000,
            move |g: crate::nft::verified::Group, _: u32| {
                log.lock().unwrap().push(g.value);
                Ok(0)
            },
        ));
        (s, swept)
    }

    #[test]
    fn every_change_moves_the_verified_generation_in_its_own_transaction() {
        use crate::nft::verified::{EPOCH_SET, stamped};
        let with_epoch = |n| {
            let mut t = table(n);
            t.sets.insert(EPOCH_SET.into(), Set::new(KeyType::Mark, false));
            t
        };
        let (mut s, swept) = with_generations();
        // The first table verifies nothing; once every value is cleared, the first
        // generation follows as an element change.
        let mut first = std::sync::Arc::new(with_epoch(1));
        assert_eq!(s.sync_keeping(&mut first, Vec::new).unwrap(), SyncKind::Full);
        let scripts = s.backend().scripts.clone();
        assert_eq!(scripts.len(), 2, "{scripts:#?}");
        assert!(scripts[0].contains("set fw-epoch {\n\t\ttype mark;\n\t}"), "{}", scripts[0]);
        assert_eq!(scripts[1], "add element inet egressd fw-epoch { 0x01000000 }\n");
        assert_eq!(stamped(&first), Some(0x0100_0000), "the caller holds what is applied");
        assert_eq!(swept.lock().unwrap()[..3], [0x0100_0000, 0x0200_0000, 0x0300_0000]);
        // Nothing else changed: nothing sent, the generation stays.
        assert_eq!(s.sync(with_epoch(1)).unwrap(), SyncKind::Unchanged);
        assert_eq!(s.backend().scripts.len(), 2);
        // A change carries the next generation in its transaction.
        assert_eq!(s.sync(with_epoch(2)).unwrap(), SyncKind::Partial);
        assert_eq!(
            s.backend().scripts[2],
            "delete element inet egressd fw-epoch { 0x01000000 }\nadd element inet egressd fw-epoch { 0x02000000 }\nadd element inet egressd s { 198.18.0.1 }\n"
        );
        assert_eq!(s.applied().and_then(stamped), Some(0x0200_0000));
        assert_eq!(s.sync(with_epoch(3)).unwrap(), SyncKind::Partial);
        assert_eq!(s.sync(with_epoch(4)).unwrap(), SyncKind::Partial);
        assert_eq!(s.applied().and_then(stamped), Some(0x0100_0000), "the values cycle");
        // Each value was cleared again after it was last current, before its reuse.
        assert_eq!(swept.lock().unwrap()[3..6], [0x0200_0000, 0x0300_0000, 0x0100_0000]);
    }

    #[test]
    fn a_change_of_what_verified_connections_walk_anyway_keeps_the_generation() {
        use crate::nft::verified::{EPOCH_SET, stamped};
        let with = |n: usize, eip: usize, chain: &str| {
            let mut t = table(n);
            t.sets.insert(EPOCH_SET.into(), Set::new(KeyType::Mark, false));
            let mut s = Set::new(KeyType::Ipv4, false);
            for i in 0..eip {
                s.elements.insert(format!("198.19.0.{i}").parse().unwrap(), Default::default());
            }
            t.sets.insert("eip-self-v4".into(), s);
            t.chains.insert("egress-snat".into(), Chain::parsed([chain]).unwrap());
            t
        };
        let (mut s, swept) = with_generations();
        s.sync_keeping(&mut std::sync::Arc::new(with(1, 0, "accept")), Vec::new).unwrap();
        assert_eq!(s.applied().and_then(stamped), Some(0x0100_0000));
        // The first group cleared up front, and the next one asked for.
        let sweeps = settled(&swept, 4);
        assert_eq!(sweeps, 4);
        // EgressIP's sets and chains alone: the generation stays, nothing is cleared.
        let mut t = std::sync::Arc::new(with(1, 1, "accept"));
        assert_eq!(s.sync_keeping(&mut t, Vec::new).unwrap(), SyncKind::Partial);
        assert_eq!(s.backend().scripts.last().unwrap(), "add element inet egressd eip-self-v4 { 198.19.0.0 }\n");
        assert_eq!(stamped(&t), Some(0x0100_0000), "the caller holds what is applied");
        assert_eq!(s.sync(with(1, 1, "counter accept")).unwrap(), SyncKind::Partial);
        assert!(!s.backend().scripts.last().unwrap().contains(EPOCH_SET), "{}", s.backend().scripts.last().unwrap());
        assert_eq!(s.applied().and_then(stamped), Some(0x0100_0000));
        assert_eq!(s.sync(with(1, 1, "counter accept")).unwrap(), SyncKind::Unchanged);
        // With a set the firewall reads, it moves (and the next clearing is asked for).
        assert_eq!(s.sync(with(2, 0, "accept")).unwrap(), SyncKind::Partial);
        assert!(s.backend().scripts.last().unwrap().contains("add element inet egressd fw-epoch { 0x02000000 }"));
        assert_eq!(s.applied().and_then(stamped), Some(0x0200_0000));
        // (A clearing asked for by the kept changes would have come before this one.)
        assert_eq!(settled(&swept, sweeps + 1), sweeps + 1);
        // Kept generations never turn the fast path off, and the cycle goes on.
        for n in 3..8 {
            assert_eq!(s.sync(with(n, n % 2, "accept")).unwrap(), SyncKind::Partial);
            assert_eq!(s.sync(with(n, (n + 1) % 2, "accept")).unwrap(), SyncKind::Partial);
        }
        // Five moves from the second value: 3, 1, 2, 3, 1.
        assert_eq!(s.applied().and_then(stamped), Some(0x0100_0000));
        assert!(!s.generations.as_ref().unwrap().is_off());
    }

    #[test]
    fn first_full_then_delta_then_nothing() {
        let mut s = NftSyncer::new(RecordingBackend::default());
        assert_eq!(s.sync(table(1)).unwrap(), SyncKind::Full);
        assert_eq!(s.sync(table(2)).unwrap(), SyncKind::Partial);
        assert_eq!(s.sync(table(2)).unwrap(), SyncKind::Unchanged);
        let scripts = &s.backend().scripts;
        assert_eq!(scripts.len(), 2);
        assert!(scripts[0].starts_with("add table inet egressd\ndelete table inet egressd\ntable inet egressd {"));
        assert_eq!(scripts[1], "add element inet egressd s { 198.18.0.1 }\n");
    }

    #[test]
    fn a_full_replace_keeps_the_learned_elements_and_a_delta_never_touches_them() {
        let slot = crate::nft::Slot { set: "dns-v4", tag: 7 };
        let learned: Element = (slot, "192.0.2.10".parse().unwrap(), Duration::from_secs(60));
        let with_dns = |n| {
            let mut t = table(n);
            t.sets.insert("dns-v4".into(), Set::with_timeout(KeyType::TaggedIpv4));
            t
        };
        let mut s = NftSyncer::new(RecordingBackend::default());
        assert_eq!(s.sync_keeping(&mut with_dns(1).into(), || vec![learned]).unwrap(), SyncKind::Full);
        // A delta: the learned elements are not asked for.
        let asked = std::cell::Cell::new(false);
        let keep = || {
            asked.set(true);
            vec![learned]
        };
        assert_eq!(s.sync_keeping(&mut with_dns(2).into(), keep).unwrap(), SyncKind::Partial);
        assert!(!asked.get(), "a delta asked for the learned elements");
        // A change only a replace makes (new base chains at one hook and priority) is
        // one, and keeps them.
        let mut base = with_dns(2);
        let hook = crate::nft::Hook { chain_type: "filter", hook: "forward", priority: "filter" };
        base.chains.insert("a".into(), Chain::base(hook.clone(), crate::nft::rule::parse_all(["counter"]).unwrap()));
        base.chains.insert("b".into(), Chain::base(hook, crate::nft::rule::parse_all(["counter"]).unwrap()));
        assert_eq!(s.sync_keeping(&mut base.into(), || vec![learned]).unwrap(), SyncKind::Full);
        let scripts = &s.backend().scripts;
        let key = crate::nft::Key::tagged(7, "192.0.2.10".parse().unwrap());
        let element = format!("add element inet egressd dns-v4 {{ {key} timeout 60s }}\n");
        assert_eq!(scripts.len(), 5, "{scripts:#?}");
        assert!(
            scripts[0].starts_with("add table inet egressd\n") && scripts[3].starts_with("add table inet egressd\n")
        );
        assert_eq!((&scripts[1], &scripts[4]), (&element, &element));
        assert_eq!(scripts[2], "add element inet egressd s { 198.18.0.1 }\n");
    }

    #[test]
    fn failed_delta_is_retried_in_full() {
        let mut s = NftSyncer::new(RecordingBackend::default());
        s.sync(table(1)).unwrap();
        s.backend_mut().fail_next = 1;
        assert_eq!(s.sync(table(3)).unwrap(), SyncKind::Full);
        let scripts = &s.backend().scripts;
        assert_eq!(scripts.len(), 3);
        assert!(scripts[2].starts_with("add table inet egressd\ndelete table inet egressd\n"));
    }

    #[test]
    fn failed_full_sync_reports_nfts_message_and_retries_in_full_next_time() {
        let mut s = NftSyncer::new(RecordingBackend::default());
        s.backend_mut().fail_next = 1;
        let err = s.sync(table(1)).unwrap_err();
        assert_eq!(err.to_string(), "nft rejected the transaction: Error: injected failure");
        assert!(s.applied().is_none());
        assert_eq!(s.sync(table(1)).unwrap(), SyncKind::Full);
    }
}
