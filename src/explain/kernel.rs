//! `egressd explain --kernel`: the explanation checked against this node's live table —
//! the pod's element in the `fw-pods` map (its traffic reaches its namespace's chain)
//! and the deciding rule's counter (it moves when the connection is retried) — and the
//! kernel's `dnsName` sets, which also hold what snooping learned.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

use super::{Explanation, KernelCheck, Verdict};
use crate::compile::FIREWALL_NAMESPACES;
use crate::dataplane::elements::ElementWriter;
use crate::dataplane::rule_counters::RuleCounter;
use crate::nft::{Key, Value};

/// The addresses in the kernel's sets of the absolute `names` (both families).
pub fn dns_sets(table: &str, names: &[String]) -> std::io::Result<BTreeMap<String, BTreeSet<IpAddr>>> {
    let mut out = BTreeMap::new();
    if names.is_empty() {
        return Ok(out);
    }
    let mut writer = ElementWriter::open(table)?;
    // Each shared set read once, its elements sorted to the names by tag.
    let mut by_tag: BTreeMap<u64, BTreeSet<IpAddr>> = BTreeMap::new();
    for set in crate::compile::DNS_SETS {
        for (tag, ip, _) in writer.dump(set)? {
            if let Some(tag) = tag {
                by_tag.entry(tag).or_default().insert(ip);
            }
        }
    }
    for name in names {
        let [slot, _] = crate::compile::dns_slots(name);
        out.insert(name.clone(), by_tag.get(&slot.tag).cloned().unwrap_or_default());
    }
    Ok(out)
}

/// Check `e` against the table on this node (`e.here`), reading counters with `nft`.
pub fn check(e: &Explanation, nft: &Path) -> KernelCheck {
    let node = e.here.as_str();
    let mut k = KernelCheck {
        node: node.to_string(),
        pod_in_map: None,
        rule_counter: None,
        shared: None,
        problems: Vec::new(),
    };
    if e.node.as_deref() != Some(node) {
        k.problems.push(format!(
            "the pod runs on node {}, not on this node ({node}): its rules are in that node's kernel",
            e.node.as_deref().unwrap_or("?")
        ));
        return k;
    }
    let (Some(src), Some(chain)) = (e.source, e.firewall.chain.as_deref()) else { return k };
    let map = if src.is_ipv4() { "fw-pods-v4" } else { "fw-pods-v6" };
    // The pod's element holds its namespace's number, and `fw-namespaces` sends the
    // number to the chain: both are read.
    let path = ElementWriter::open(&e.table).and_then(|mut w| {
        let number = w.lookup(map, &Key::Addr(src))?;
        let jump = match &number {
            Some(Value::Classid(n)) => w.lookup(FIREWALL_NAMESPACES, &Key::Classid(*n))?,
            _ => None,
        };
        Ok((number, jump))
    });
    let unsynced = "(is the agent running and in sync?)";
    match path {
        Ok((None, _)) => {
            k.pod_in_map = Some(false);
            k.problems.push(format!("{src} is not in {map}: its traffic does not reach {chain} {unsynced}"));
        }
        Ok((Some(number), jump)) => {
            let reaches = jump.as_ref().is_some_and(|j| *j == Value::Jump(chain.into()));
            k.pod_in_map = Some(reaches);
            if !reaches {
                let goes = match jump {
                    Some(Value::Jump(c)) => format!("to {c}"),
                    Some(other) => format!("to {other}"),
                    None => "nowhere".to_string(),
                };
                k.problems.push(format!(
                    "{src} maps to {number} in {map}, which {FIREWALL_NAMESPACES} sends {goes}, not to {chain} {unsynced}"
                ));
            }
        }
        Err(err) => k.problems.push(format!("cannot read {map} of table inet {}: {err}", e.table)),
    }
    if let Some(rule) = &e.firewall.rule {
        match crate::dataplane::rule_counters::read(nft, &e.table, Some(chain)) {
            // The counters holding the rule: one, or where a chain's rules are flattened
            // (`compile/boxes.rs`) the lookups of its verdict that span its index (its
            // ported and its portless pieces), summed.
            Ok(counters) => match holding(&counters, rule.index, e.firewall.verdict) {
                Some((packets, bytes, first, last)) => {
                    k.rule_counter = Some((packets, bytes));
                    if last != first {
                        k.shared = Some((first, last));
                    }
                }
                None => k.problems.push(format!("rule {} is not in chain {chain}", rule.index)),
            },
            Err(err) => k.problems.push(format!("cannot read chain {chain}: {err}")),
        }
    }
    k
}

/// The counters that hold rule `index` with the explained verdict (else any one holding
/// it), summed: packets, bytes and the rules they count for (first, last).
fn holding(counters: &[RuleCounter], index: usize, verdict: Verdict) -> Option<(u64, u64, usize, usize)> {
    let verdict = if verdict == Verdict::Allowed { "accept" } else { "drop" };
    let holds = || counters.iter().filter(move |c| c.index <= index && index <= c.last);
    let mut sum: Option<(u64, u64, usize, usize)> = None;
    for c in holds().filter(|c| c.verdict == verdict) {
        let (p, b, first, last) = sum.unwrap_or((0, 0, c.index, c.last));
        sum = Some((p + c.packets, b + c.bytes, first.min(c.index), last.max(c.last)));
    }
    sum.or_else(|| holds().next().map(|c| (c.packets, c.bytes, c.index, c.last)))
}
