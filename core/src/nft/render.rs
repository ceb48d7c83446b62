//! nft syntax for the table model.

use std::fmt::Write;

use super::{Chain, FAMILY, Key, Set, Table, Value};

/// `elements` as an nft element list (`key`, `key timeout 5s`, `key : jump c`), in the
/// order of their text (the order nft's own listing and the goldens have, whatever the
/// keys' typed order).
pub(super) fn elements<'a>(elements: impl Iterator<Item = (&'a Key, &'a Value)>) -> String {
    let mut items: Vec<(String, &Value)> = elements.map(|(k, v)| (k.to_string(), v)).collect();
    items.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let items: Vec<String> = items
        .into_iter()
        .map(|(k, v)| match v {
            Value::None => k,
            v @ (Value::Jump(_) | Value::Classid(_)) => format!("{k} : {v}"),
            v @ Value::Timeout(_) => format!("{k} {v}"),
        })
        .collect();
    items.join(", ")
}

fn set_block(out: &mut String, name: &str, set: &Set) {
    let _ = writeln!(out, "\t{} {name} {{", set.keyword());
    for part in set.declaration().split_inclusive(';') {
        let _ = writeln!(out, "\t\t{}", part.trim());
    }
    if !set.elements.is_empty() {
        let _ = writeln!(out, "\t\telements = {{ {} }}", elements(set.elements.iter()));
    }
    let _ = writeln!(out, "\t}}");
}

fn chain_block(out: &mut String, name: &str, chain: &Chain) {
    let _ = writeln!(out, "\tchain {name} {{");
    if let Some(h) = &chain.hook {
        let _ = writeln!(out, "\t\t{}", h.declaration());
    }
    for rule in chain.rules.iter() {
        let _ = writeln!(out, "\t\t{rule}");
    }
    let _ = writeln!(out, "\t}}");
}

/// The table as one block. Order matters to nft within one transaction: plain sets,
/// then regular chains (jump targets), then verdict maps (which reference those chains),
/// then base chains (which reference sets and maps).
pub(super) fn table_block(table: &Table) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "table {FAMILY} {} {{", table.name);
    for name in super::COUNTERS {
        let _ = writeln!(out, "\tcounter {name} {{\n\t}}");
    }
    for (name, set) in table.sets.iter().filter(|(_, s)| !s.is_verdict_map()) {
        set_block(&mut out, name, set);
    }
    for (name, chain) in table.chains.iter().filter(|(_, c)| c.hook.is_none()) {
        chain_block(&mut out, name, chain);
    }
    for (name, set) in table.sets.iter().filter(|(_, s)| s.is_verdict_map()) {
        set_block(&mut out, name, set);
    }
    for (name, chain) in table.chains.iter().filter(|(_, c)| c.hook.is_some()) {
        chain_block(&mut out, name, chain);
    }
    out.push_str("}\n");
    out
}
