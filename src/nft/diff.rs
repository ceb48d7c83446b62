//! The smallest atomic nft script that turns one table into another.

use std::fmt::Write;

use super::render::elements;
use super::{FAMILY, Table};

/// The script that changes `old` into `new`, or `None` when they are equal. A change
/// that cannot be expressed as a delta (the table's name, a set's type or flags, a base
/// chain's hook, a new base chain) gets the full replace script instead.
///
/// Order inside the one transaction: new chains (so map elements may jump to them), new
/// sets, rules of new/changed regular chains, element deletions, element additions,
/// rules of changed base chains, then removal of chains and sets nothing references any
/// more.
pub fn diff(old: &Table, new: &Table) -> Option<String> {
    if old == new {
        return None;
    }
    let t = format!("{FAMILY} {}", new.name);
    let structural_change = old.name != new.name
        || old.sets.iter().any(|(n, s)| {
            new.sets
                .get(n)
                .is_some_and(|ns| ns.key != s.key || ns.verdict_map != s.verdict_map || ns.interval != s.interval)
        })
        || old.chains.iter().any(|(n, c)| new.chains.get(n).is_some_and(|nc| nc.hook != c.hook))
        || new.chains.iter().any(|(n, c)| c.hook.is_some() && !old.chains.contains_key(n));
    if structural_change {
        return Some(new.replace_script());
    }

    let mut out = String::new();
    // 1. New regular chains, declared empty.
    for name in new.chains.keys().filter(|n| !old.chains.contains_key(*n)) {
        let _ = writeln!(out, "add chain {t} {name}");
    }
    // 2. New sets and maps.
    for (name, set) in new.sets.iter().filter(|(n, _)| !old.sets.contains_key(*n)) {
        let _ = writeln!(out, "add {} {t} {name} {{ {} }}", set.keyword(), set.declaration());
    }
    // 3. Rules of new or changed regular chains.
    for (name, chain) in new.chains.iter().filter(|(_, c)| c.hook.is_none()) {
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
    // 4. Element deletions (also where a map element's verdict changes), then additions.
    for (name, set) in &new.sets {
        let Some(before) = old.sets.get(name) else {
            continue;
        };
        // In a timeout set a changed value is a new timeout: re-adding refreshes it, so
        // only elements that are gone are deleted (an element may also have expired in
        // the kernel already, where a delete would fail).
        let gone: Vec<String> = before
            .elements
            .iter()
            .filter(|(k, v)| match set.elements.get(*k) {
                None => true,
                Some(new) => !set.timeout && new != *v,
            })
            .map(|(k, _)| k.clone())
            .collect();
        if !gone.is_empty() {
            let _ = writeln!(out, "delete element {t} {name} {{ {} }}", gone.join(", "));
        }
    }
    for (name, set) in &new.sets {
        let before = old.sets.get(name);
        let added: Vec<String> = set
            .elements
            .iter()
            .filter(|(k, v)| before.is_none_or(|b| b.elements.get(*k) != Some(v)))
            .map(|(k, _)| k.clone())
            .collect();
        if !added.is_empty() {
            let _ = writeln!(out, "add element {t} {name} {{ {} }}", elements(set, added.into_iter()));
        }
    }
    // 5. Changed base chains.
    for (name, chain) in new.chains.iter().filter(|(_, c)| c.hook.is_some()) {
        if old.chains.get(name).is_some_and(|b| b.rules == chain.rules) {
            continue;
        }
        let _ = writeln!(out, "flush chain {t} {name}");
        for rule in chain.rules.iter() {
            let _ = writeln!(out, "add rule {t} {name} {rule}");
        }
    }
    // 6. Chains and sets that are gone. Chains may still jump to each other, so flush
    //    them all before deleting any.
    let gone_chains: Vec<&String> = old.chains.keys().filter(|n| !new.chains.contains_key(*n)).collect();
    for name in &gone_chains {
        let _ = writeln!(out, "flush chain {t} {name}");
    }
    for name in &gone_chains {
        let _ = writeln!(out, "delete chain {t} {name}");
    }
    for (name, set) in old.sets.iter().filter(|(n, _)| !new.sets.contains_key(*n)) {
        let _ = writeln!(out, "delete {} {t} {name}", set.keyword());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::{Chain, Hook, KeyType, Set, Table};
    use super::*;

    fn table() -> Table {
        let mut t = Table::new("egressd");
        let mut m = Set::verdict_map(KeyType::Ipv4);
        m.elements.insert("198.18.1.2".into(), "jump fw-a".into());
        t.sets.insert("fw-pods-v4".into(), m);
        t.chains.insert("fw-a".into(), Chain::regular(vec!["ip daddr 192.0.2.0/24 counter drop".into()]));
        t.chains.insert(
            "firewall".into(),
            Chain::base(
                Hook { chain_type: "filter", hook: "forward", priority: "filter" },
                vec!["ip saddr vmap @fw-pods-v4".into()],
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
        new.sets.get_mut("fw-pods-v4").unwrap().elements.insert("198.18.1.3".into(), "jump fw-a".into());
        assert_eq!(diff(&old, &new).unwrap(), "add element inet egressd fw-pods-v4 { 198.18.1.3 : jump fw-a }\n");
    }

    #[test]
    fn new_namespace_chain_comes_before_its_elements_and_old_one_goes_last() {
        let old = table();
        let mut new = table();
        new.chains.remove("fw-a");
        new.chains.insert("fw-b".into(), Chain::regular(vec!["counter accept".into()]));
        new.sets.get_mut("fw-pods-v4").unwrap().elements.insert("198.18.1.2".into(), "jump fw-b".into());
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
        s.elements.insert("192.0.2.1".into(), "timeout 305s".into());
        s.elements.insert("192.0.2.2".into(), "timeout 305s".into());
        old.sets.insert("dns4-a".into(), s);
        let mut new = old.clone();
        let set = new.sets.get_mut("dns4-a").unwrap();
        set.elements.insert("192.0.2.1".into(), "timeout 310s".into());
        set.elements.remove("192.0.2.2");
        assert_eq!(
            diff(&old, &new).unwrap(),
            "delete element inet egressd dns4-a { 192.0.2.2 }\n\
             add element inet egressd dns4-a { 192.0.2.1 timeout 310s }\n"
        );
    }

    #[test]
    fn hook_change_falls_back_to_full_replace() {
        let old = table();
        let mut new = table();
        new.chains.get_mut("firewall").unwrap().hook.as_mut().unwrap().priority = "mangle";
        assert!(diff(&old, &new).unwrap().starts_with("add table inet egressd\ndelete table inet egressd\n"));
    }
}
