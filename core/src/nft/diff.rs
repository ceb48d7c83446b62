//! The smallest atomic nft script that turns one table into another.

use std::fmt::Write;

use super::render::elements;
use super::{FAMILY, Table, Text};

/// The script that changes `old` into `new`, or `None` when they are equal. A change
/// that cannot be expressed as a delta (the table's name, a set's type or flags, a base
/// chain's hook, a new base chain beside another at its hook and priority:
/// [`super::Comparison::needs_replace`]) gets the full replace script instead.
///
/// Order inside the one transaction: new chains (so map elements may jump to them), new
/// sets, rules of new/changed regular chains, element deletions, element additions,
/// rules of changed base chains, then removal of what is gone: chains flushed, sets and
/// maps deleted, chains deleted (nothing references any of them by then).
pub fn diff(old: &Table, new: &Table) -> Option<String> {
    if old == new {
        return None;
    }
    let t = format!("{FAMILY} {}", new.name);
    if super::Comparison::of(old, new).needs_replace() {
        return Some(new.replace_script());
    }

    let mut out = String::new();
    // 1. New chains, declared empty (a base chain with its hook: the transaction is
    //    atomic, no packet sees it before its rules).
    for (name, chain) in new.chains.iter().filter(|(n, _)| !old.chains.contains_key(*n)) {
        match &chain.hook {
            None => {
                let _ = writeln!(out, "add chain {t} {name}");
            }
            Some(h) => {
                let _ = writeln!(out, "add chain {t} {name} {{ {} }}", h.declaration());
            }
        }
    }
    // 2. New sets and maps.
    for (name, set) in new.sets.iter().filter(|(n, _)| !old.sets.contains_key(*n)) {
        let _ = writeln!(out, "add {} {t} {name} {{ {} }}", set.keyword(), set.declaration());
    }
    // 3. Rules of new or changed regular chains.
    chain_rules(&mut out, &t, old, new, false);
    // 4. Element deletions (also where a map element's verdict changes), then additions.
    element_changes(&mut out, &t, old, new);
    // 5. New and changed base chains.
    chain_rules(&mut out, &t, old, new, true);
    // 6. Chains and sets that are gone.
    removals(&mut out, &t, old, new);
    Some(out)
}

/// Flush and fill the new or changed chains (base chains or regular ones).
fn chain_rules(out: &mut String, t: &str, old: &Table, new: &Table, base: bool) {
    for (name, chain) in new.chains.iter().filter(|(_, c)| c.hook.is_some() == base) {
        let before = old.chains.get(name);
        if before.is_some_and(|b| b.rules == chain.rules) {
            continue;
        }
        if before.is_some() {
            let _ = writeln!(out, "flush chain {t} {name}");
        }
        for rule in chain.rules.iter() {
            let _ = writeln!(out, "add rule {t} {name} {rule}");
        }
    }
}

/// The elements of the sets both tables have: deletions first, then additions.
fn element_changes(out: &mut String, t: &str, old: &Table, new: &Table) {
    for (name, set) in &new.sets {
        let Some(before) = old.sets.get(name) else {
            continue;
        };
        // In a timeout set a changed value is a new timeout: re-adding refreshes it, so
        // only elements that are gone are deleted (an element may also have expired in
        // the kernel already, where a delete would fail).
        let mut gone: Vec<String> = before
            .elements
            .iter()
            .filter(|(k, v)| match set.elements.get(*k) {
                None => true,
                Some(new) => !set.timeout && new != *v,
            })
            .map(|(k, _)| k.to_string())
            .collect();
        gone.sort_unstable();
        if !gone.is_empty() {
            let _ = writeln!(out, "delete element {t} {name} {{ {} }}", gone.join(", "));
        }
    }
    for (name, set) in &new.sets {
        let before = old.sets.get(name);
        let added: Vec<_> =
            set.elements.iter().filter(|(k, v)| before.is_none_or(|b| b.elements.get(*k) != Some(*v))).collect();
        if !added.is_empty() {
            let _ = writeln!(out, "add element {t} {name} {{ {} }}", elements(added.into_iter()));
        }
    }
}

/// Chains and sets that are gone. Chains may still jump to each other and use sets, and
/// gone maps may still jump to gone chains: flush the chains, delete the sets and maps,
/// then delete the chains.
fn removals(out: &mut String, t: &str, old: &Table, new: &Table) {
    let gone_chains: Vec<&Text> = old.chains.keys().filter(|n| !new.chains.contains_key(*n)).collect();
    for name in &gone_chains {
        let _ = writeln!(out, "flush chain {t} {name}");
    }
    for (name, set) in old.sets.iter().filter(|(n, _)| !new.sets.contains_key(*n)) {
        let _ = writeln!(out, "delete {} {t} {name}", set.keyword());
    }
    for name in &gone_chains {
        let _ = writeln!(out, "delete chain {t} {name}");
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Chain, Hook, KeyType, Set, Table};
    use super::*;

    fn table() -> Table {
        let mut t = Table::new("egressd");
        let mut m = Set::verdict_map(KeyType::Ipv4);
        m.elements.insert("198.18.1.2".parse().unwrap(), "jump fw-a".parse().unwrap());
        t.sets.insert("fw-pods-v4".into(), m);
        t.chains.insert("fw-a".into(), Chain::parsed(["ip daddr 192.0.2.0/24 counter drop"]).unwrap());
        t.chains.insert(
            "firewall".into(),
            Chain::base(
                Hook { chain_type: "filter", hook: "forward", priority: "filter" },
                crate::nft::rule::parse_all(["ip saddr vmap @fw-pods-v4"]).unwrap(),
            ),
        );
        t
    }

    #[test]
    fn equal_tables_need_nothing() {
        assert_eq!(diff(&table(), &table()), None);
    }

    #[test]
    fn element_change_touches_only_elements() {
        let old = table();
        let mut new = table();
        new.sets
            .get_mut("fw-pods-v4")
            .unwrap()
            .elements
            .insert("198.18.1.3".parse().unwrap(), "jump fw-a".parse().unwrap());
        assert_eq!(diff(&old, &new).unwrap(), "add element inet egressd fw-pods-v4 { 198.18.1.3 : jump fw-a }\n");
    }

    #[test]
    fn new_namespace_chain_comes_before_its_elements_and_old_one_goes_last() {
        let old = table();
        let mut new = table();
        new.chains.remove("fw-a");
        new.chains.insert("fw-b".into(), Chain::parsed(["counter accept"]).unwrap());
        new.sets
            .get_mut("fw-pods-v4")
            .unwrap()
            .elements
            .insert("198.18.1.2".parse().unwrap(), "jump fw-b".parse().unwrap());
        assert_eq!(
            diff(&old, &new).unwrap(),
            "add chain inet egressd fw-b\n\
             add rule inet egressd fw-b counter accept\n\
             delete element inet egressd fw-pods-v4 { 198.18.1.2 }\n\
             add element inet egressd fw-pods-v4 { 198.18.1.2 : jump fw-b }\n\
             flush chain inet egressd fw-a\n\
             delete chain inet egressd fw-a\n"
        );
    }

    #[test]
    fn timeout_sets_refresh_by_re_adding() {
        let mut old = table();
        let mut s = Set::with_timeout(KeyType::Ipv4);
        s.elements.insert("192.0.2.1".parse().unwrap(), "timeout 305s".parse().unwrap());
        s.elements.insert("192.0.2.2".parse().unwrap(), "timeout 305s".parse().unwrap());
        old.sets.insert("dns4-a".into(), s);
        let mut new = old.clone();
        let set = new.sets.get_mut("dns4-a").unwrap();
        set.elements.insert("192.0.2.1".parse().unwrap(), "timeout 310s".parse().unwrap());
        set.elements.remove(&"192.0.2.2".parse().unwrap());
        assert_eq!(
            diff(&old, &new).unwrap(),
            "delete element inet egressd dns4-a { 192.0.2.2 }\n\
             add element inet egressd dns4-a { 192.0.2.1 timeout 310s }\n"
        );
    }

    #[test]
    fn a_new_base_chain_is_added_in_place_unless_another_runs_at_its_hook_and_priority() {
        let old = table();
        let mut new = table();
        let own = Hook { chain_type: "nat", hook: "postrouting", priority: "srcnat - 1" };
        new.chains.insert("egress".into(), Chain::base(own, crate::nft::rule::parse_all(["counter"]).unwrap()));
        assert_eq!(
            diff(&old, &new).unwrap(),
            "add chain inet egressd egress { type nat hook postrouting priority srcnat - 1; policy accept; }\n\
             add rule inet egressd egress counter\n"
        );
        assert_eq!(diff(&new, &old).unwrap(), "flush chain inet egressd egress\ndelete chain inet egressd egress\n");
        // Priority 0 is `filter`'s: the kernel would run it after `firewall` where a
        // fresh start runs it before (name order).
        let mut beside = table();
        let same = Hook { chain_type: "filter", hook: "forward", priority: "0" };
        beside.chains.insert("a-first".into(), Chain::base(same, crate::nft::rule::parse_all(["counter"]).unwrap()));
        assert!(diff(&old, &beside).unwrap().starts_with("add table inet egressd\ndelete table inet egressd\n"));
    }

    #[test]
    fn hook_change_falls_back_to_full_replace() {
        let old = table();
        let mut new = table();
        new.chains.get_mut("firewall").unwrap().hook.as_mut().unwrap().priority = "mangle";
        assert!(diff(&old, &new).unwrap().starts_with("add table inet egressd\ndelete table inet egressd\n"));
    }
}

/// The applied-table cache: the script [`diff`] sends, run against a model of nft's
/// semantics (elements must exist to be deleted, a map key cannot be re-added with
/// another verdict, a chain must be empty and unreferenced to be deleted, references
/// must exist when added), turns the applied table into exactly the desired one — for
/// random pairs of tables.
#[cfg(test)]
mod props {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::super::element::{read, read_key};
    use super::super::{Chain, Hook, KeyType, Set, Table, Value};
    use super::diff;

    /// `items` (key text, value text) as the elements of `set`.
    fn fill(set: &mut Set, items: impl IntoIterator<Item = (String, String)>) {
        let elements: Vec<_> = items.into_iter().map(|(k, v)| read(set, &k, &v).expect("an element")).collect();
        set.elements.extend(elements);
    }

    const CHAINS: [&str; 4] = ["c0", "c1", "c2", "c3"];
    const ADDRS: [&str; 5] = ["192.0.2.1", "192.0.2.2", "192.0.2.3", "198.51.100.1", "198.51.100.2"];

    fn hook() -> Hook {
        Hook { chain_type: "filter", hook: "forward", priority: "filter" }
    }

    prop_compose! {
        fn table()(
            chains in proptest::sample::subsequence(CHAINS.to_vec(), 0..=4),
            rule_picks in proptest::collection::vec((0usize..4, 0usize..6), 0..10),
            plain in proptest::option::of(proptest::sample::subsequence(ADDRS.to_vec(), 0..=5)),
            timed in proptest::option::of(proptest::collection::btree_map(proptest::sample::select(ADDRS.to_vec()), 1u32..4, 0..5)),
            map in proptest::option::of(proptest::collection::btree_map(proptest::sample::select(ADDRS.to_vec()), 0usize..4, 0..5)),
            base in proptest::collection::vec(0usize..4, 0..4),
            more_base in 0usize..4,
            ranges in proptest::option::of(proptest::sample::subsequence(
                vec!["0.0.0.0/1", "192.0.2.0/25", "192.0.2.128/26", "198.51.100.7/32", "203.0.113.0/24"], 0..=5)),
        ) -> Table {
            let mut t = Table::new("egressd");
            let mut regular: BTreeMap<String, Vec<String>> = chains.iter().map(|c| (c.to_string(), Vec::new())).collect();
            let names: Vec<String> = regular.keys().cloned().collect();
            if let Some(p) = &plain {
                let mut s = Set::new(KeyType::Ipv4, false);
                fill(&mut s, p.iter().map(|a| (a.to_string(), String::new())));
                t.sets.insert("plain".into(), s);
            }
            if let Some(r) = &ranges {
                let mut s = Set::new(KeyType::Ipv4, true);
                fill(&mut s, r.iter().map(|n| (n.to_string(), String::new())));
                t.sets.insert("ranges".into(), s);
            }
            if let Some(tm) = &timed {
                let mut s = Set::with_timeout(KeyType::Ipv4);
                fill(&mut s, tm.iter().map(|(a, n)| (a.to_string(), format!("timeout {}s", n * 100))));
                t.sets.insert("timed".into(), s);
            }
            if let Some(m) = map.as_ref().filter(|_| !names.is_empty()) {
                let mut s = Set::verdict_map(KeyType::Ipv4);
                fill(&mut s, m.iter().map(|(a, c)| (a.to_string(), format!("jump {}", names[c % names.len()]))));
                t.sets.insert("map".into(), s);
            }
            for (i, (c, r)) in rule_picks.iter().enumerate() {
                if names.is_empty() {
                    break;
                }
                let chain = &names[c % names.len()];
                let rule = match r {
                    0 => "counter accept".to_string(),
                    1 => format!("ip daddr 192.0.2.{i} drop"),
                    2 if t.sets.contains_key("plain") => "ip daddr @plain accept".to_string(),
                    3 if t.sets.contains_key("timed") => "ip daddr @timed accept".to_string(),
                    // A later chain only (no loops).
                    _ => match names.iter().find(|n| *n > chain) {
                        Some(target) => format!("jump {target}"),
                        None => "counter drop".to_string(),
                    },
                };
                if let Some(rules) = regular.get_mut(chain) {
                    rules.push(rule);
                }
            }
            for (name, rules) in regular {
                t.chains.insert(name.into(), Chain::parsed(rules.iter().map(String::as_str)).unwrap());
            }
            let mut base_rules = vec!["ct direction reply accept".to_string()];
            for b in base {
                match b {
                    0 if t.sets.contains_key("map") => base_rules.push("ip saddr vmap @map".into()),
                    1 if t.sets.contains_key("plain") => base_rules.push("ip daddr @plain drop".into()),
                    2 => base_rules.push("counter".into()),
                    _ => {}
                }
            }
            t.chains.insert("firewall".into(), Chain::base(hook(), crate::nft::rule::parse_all(base_rules.iter().map(String::as_str)).unwrap()));
            // Base chains that come and go: one at a hook and priority of its own, one
            // beside `firewall` (a change may add only the first).
            if more_base & 1 == 1 {
                let own = Hook { chain_type: "nat", hook: "postrouting", priority: "srcnat - 1" };
                t.chains.insert("egress".into(), Chain::base(own, crate::nft::rule::parse_all(["counter"]).unwrap()));
            }
            if more_base & 2 == 2 {
                t.chains.insert("beside".into(), Chain::base(hook(), crate::nft::rule::parse_all(["counter"]).unwrap()));
            }
            t
        }
    }

    fn braces(line: &str) -> Vec<String> {
        let inner = line.split_once('{').and_then(|(_, r)| r.rsplit_once('}')).map(|(i, _)| i).unwrap_or("");
        inner.split(", ").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
    }

    fn referenced(t: &Table, name: &str) -> bool {
        let jump = format!("jump {name}");
        let at = format!("@{name}");
        t.chains.values().any(|c| {
            c.rules
                .iter()
                .map(|r| r.to_string())
                .any(|r| r.split_whitespace().any(|w| w == name || w == at) || r.ends_with(&jump))
        }) || t.sets.values().any(|s| s.elements.values().any(|v| *v == Value::Jump(name.into())))
    }

    /// Run `script` against `t` as nft would (one transaction: any error fails it).
    fn run(mut t: Table, script: &str, desired: &Table) -> Result<Table, String> {
        if script.starts_with("add table") {
            return Ok(desired.clone());
        }
        let prefix = "inet egressd ";
        for line in script.lines() {
            let (verb, rest) = line.split_once(prefix).ok_or(format!("bad line {line}"))?;
            let name = rest.split_whitespace().next().unwrap_or_default().to_string();
            match verb.trim() {
                "add chain" => {
                    // A base chain is declared with the hook the desired table gives it.
                    let hook = desired.chains.get(name.as_str()).and_then(|c| c.hook.clone());
                    let declared = rest[name.len()..].trim();
                    let wanted = hook.as_ref().map_or(String::new(), |h| {
                        format!("{{ type {} hook {} priority {}; policy accept; }}", h.chain_type, h.hook, h.priority)
                    });
                    if declared != wanted {
                        return Err(format!("{line}: declared {declared:?}, desired {wanted:?}"));
                    }
                    if t.chains.insert(name.as_str().into(), Chain { hook, ..Chain::default() }).is_some() {
                        return Err(format!("{line}: exists"));
                    }
                }
                "add set" | "add map" => {
                    let template = desired.sets.get(name.as_str()).ok_or(format!("{line}: not desired"))?;
                    let mut s = template.clone();
                    s.elements.clear();
                    if t.sets.insert(name.as_str().into(), s).is_some() {
                        return Err(format!("{line}: exists"));
                    }
                }
                "add rule" => {
                    let rule = rest[name.len()..].trim().to_string();
                    for w in rule.split_whitespace() {
                        if let Some(set) = w.strip_prefix('@') {
                            t.sets.get(set).ok_or(format!("{line}: no set {set}"))?;
                        }
                    }
                    if let Some(target) = rule.strip_prefix("jump ") {
                        t.chains.get(target).ok_or(format!("{line}: no chain {target}"))?;
                    }
                    let chain = t.chains.get_mut(name.as_str()).ok_or(format!("{line}: no chain"))?;
                    std::sync::Arc::make_mut(&mut chain.rules).push(rule.parse().map_err(|e| format!("{line}: {e}"))?);
                }
                "flush chain" => {
                    let chain = t.chains.get_mut(name.as_str()).ok_or(format!("{line}: no chain"))?;
                    chain.rules = Default::default();
                }
                "delete chain" => {
                    let chain = t.chains.get(name.as_str()).ok_or(format!("{line}: no chain"))?;
                    if !chain.rules.is_empty() || referenced(&t, &name) {
                        return Err(format!("{line}: busy"));
                    }
                    t.chains.remove(name.as_str());
                }
                "delete set" | "delete map" => {
                    t.sets.get(name.as_str()).ok_or(format!("{line}: no set"))?;
                    if referenced(&t, &name) {
                        return Err(format!("{line}: busy"));
                    }
                    t.sets.remove(name.as_str());
                }
                "delete element" => {
                    let set = t.sets.get_mut(name.as_str()).ok_or(format!("{line}: no set"))?;
                    for k in braces(line) {
                        let key = read_key(set, &k).ok_or(format!("{line}: {k} is no key of the set"))?;
                        set.elements.remove(&key).ok_or(format!("{line}: no element {k}"))?;
                    }
                }
                "add element" => {
                    let chains: Vec<String> = t.chains.keys().map(|c| c.to_string()).collect();
                    let set = t.sets.get_mut(name.as_str()).ok_or(format!("{line}: no set"))?;
                    for item in braces(line) {
                        let (k, v) = if set.data != super::super::Data::None {
                            let (k, v) = item.split_once(" : ").ok_or(format!("{line}: {item}"))?;
                            let target = v.strip_prefix("jump ").unwrap_or_default();
                            if set.is_verdict_map() && !chains.iter().any(|c| c == target) {
                                return Err(format!("{line}: no chain {target}"));
                            }
                            (k.to_string(), v.to_string())
                        } else {
                            match item.split_once(' ') {
                                Some((k, v)) => (k.to_string(), v.to_string()),
                                None => (item.clone(), String::new()),
                            }
                        };
                        let (k, v) = read(set, &k, &v).ok_or(format!("{line}: {item} is no element of the set"))?;
                        if set.data != super::super::Data::None && set.elements.get(&k).is_some_and(|old| *old != v) {
                            return Err(format!("{line}: {k} exists with another value"));
                        }
                        set.elements.insert(k, v);
                    }
                }
                other => return Err(format!("unknown verb {other:?} in {line}")),
            }
        }
        Ok(t)
    }

    /// `old` with the elements of `new`'s sets of the same name and declaration (map
    /// elements only where they jump to a chain of `old`): tables that differ in
    /// elements only.
    fn elements_of(old: &Table, new: &Table) -> Table {
        let mut out = old.clone();
        for (name, set) in out.sets.iter_mut() {
            let Some(other) = new.sets.get(name).filter(|o| o.timeout == set.timeout && o.data == set.data) else {
                continue;
            };
            set.elements = other
                .elements
                .iter()
                .filter(|(_, v)| match v {
                    Value::Jump(c) => old.chains.contains_key(c),
                    _ => true,
                })
                .map(|(k, v)| (*k, v.clone()))
                .collect();
        }
        out
    }

    proptest! {
        /// The typed element delta is exactly the change `diff` would script, and it is
        /// found whenever only elements differ (and never otherwise).
        #[test]
        fn element_deltas_are_the_scripted_change(old in table(), new in table()) {
            use super::super::delta::ElementDelta;
            let only_elements = elements_of(&old, &new);
            for desired in [&only_elements, &new] {
                match ElementDelta::between(&old, desired) {
                    Some(delta) => match diff(&old, desired) {
                        None => prop_assert!(delta.is_empty()),
                        Some(script) => prop_assert_eq!(delta.script("egressd"), script),
                    },
                    None => {
                        prop_assert!(!std::ptr::eq(desired, &only_elements), "elements only, but no delta");
                        prop_assert!(old.chains != desired.chains || old.sets.keys().ne(desired.sets.keys()));
                    }
                }
            }
        }

        #[test]
        fn the_delta_turns_the_applied_table_into_the_desired_one(old in table(), new in table()) {
            match diff(&old, &new) {
                None => prop_assert_eq!(&old, &new),
                Some(script) => {
                    let got = run(old.clone(), &script, &new).map_err(|e| TestCaseError::fail(format!("{e}\n{script}")))?;
                    prop_assert_eq!(got, new, "{}", script);
                }
            }
        }
    }
}
