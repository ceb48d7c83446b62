//! Per-rule counters read back from the kernel: every EgressFirewall and EgressQoS rule
//! egressd writes carries a counter and the comment `egress[<index>]` (its index in
//! `spec.egress`), or `egress[<first>..<last>]` for a run of same-action rules merged
//! into one, in the namespace's chain (`fw-<namespace>`, `qos-<namespace>`). A rule
//! compiled into several statements (one per address family) is summed.
//!
//! Read over nf_tables netlink (a `GETRULE` dump, [`super::elements::ElementWriter::rules`]),
//! else with `nft -j list chain|table` (reads only, no transaction; `nft` reads the whole
//! table first: 0.3 s at 100k rules per chain asked for), for `egressd status --counters`,
//! `egressd explain --kernel` and the per-namespace metrics of namespaces with ACL
//! logging, read every 5 s.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use super::elements::RuleRead;
use super::nft_run::NftError;

/// One rule's counter.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuleCounter {
    /// The chain (`fw-<namespace>`, `qos-<namespace>`).
    pub chain: String,
    /// The rule's index in `spec.egress` (the first of a merged run).
    pub index: usize,
    /// The last rule index it counts for (`index` unless a merged run).
    pub last: usize,
    /// What the rule does: `accept`, `drop`, `return` (EgressQoS marks then returns).
    pub verdict: String,
    /// Packets counted.
    pub packets: u64,
    /// Bytes counted.
    pub bytes: u64,
}

/// The rule counters in `nft -j list chain|table` output, by (chain, index), summed over
/// a rule's statements. Rules without an `egress[i]` comment (base chains, the ACL
/// logging rules) are left out.
pub fn parse(json: &[u8]) -> Vec<RuleCounter> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else { return Vec::new() };
    let Some(items) = value.get("nftables").and_then(|v| v.as_array()) else { return Vec::new() };
    by_policy_rule(items.iter().filter_map(|i| i.get("rule")).filter_map(|rule| {
        let exprs = rule.get("expr").and_then(|e| e.as_array()).map(Vec::as_slice).unwrap_or_default();
        // The anonymous counter is an object; a named counter reference is a string.
        let (packets, bytes) = exprs
            .iter()
            .filter_map(|e| e.get("counter")?.as_object())
            .map(|c| (c.get("packets").and_then(|v| v.as_u64()), c.get("bytes").and_then(|v| v.as_u64())))
            .fold((0, 0), |(p, b), (dp, db)| (p + dp.unwrap_or(0), b + db.unwrap_or(0)));
        let verdict = exprs
            .iter()
            .find_map(|e| ["accept", "drop", "return"].into_iter().find(|v| e.get(*v).is_some()))
            .unwrap_or("continue");
        Some(RuleRead {
            chain: rule.get("chain")?.as_str()?.to_string(),
            comment: rule.get("comment").and_then(|c| c.as_str()).map(str::to_string),
            packets,
            bytes,
            verdict,
        })
    }))
}

/// Rules with an `egress[i]` or `egress[i..j]` comment, by (chain, index), summed over
/// a rule's statements.
fn by_policy_rule(rules: impl IntoIterator<Item = RuleRead>) -> Vec<RuleCounter> {
    let mut out: BTreeMap<(String, usize), RuleCounter> = BTreeMap::new();
    for rule in rules {
        let Some((index, last)) =
            rule.comment.as_deref().and_then(|c| c.strip_prefix("egress[")).and_then(|c| c.strip_suffix(']')).and_then(
                |c| match c.split_once("..") {
                    Some((a, b)) => Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)),
                    None => c.parse::<usize>().ok().map(|i| (i, i)),
                },
            )
        else {
            continue;
        };
        // A firewall allow that marks its connection verified returns to the base chain,
        // which accepts (`nft::verified`).
        let verdict = if rule.verdict == "return" && rule.chain.starts_with("fw-") { "accept" } else { rule.verdict };
        let entry = out.entry((rule.chain.clone(), index)).or_insert_with(|| RuleCounter {
            chain: rule.chain,
            index,
            last,
            verdict: verdict.to_string(),
            packets: 0,
            bytes: 0,
        });
        entry.packets += rule.packets;
        entry.bytes += rule.bytes;
    }
    out.into_values().collect()
}

/// `egressd status --counters`: one line per rule, by chain.
pub fn render(table: &str, counters: &[RuleCounter]) -> String {
    let mut out = format!("# rule counters (kernel, table inet {table}): chain, rule, verdict, packets, bytes\n");
    if counters.is_empty() {
        out.push_str("(no EgressFirewall or EgressQoS rules in the kernel)\n");
    }
    for c in counters {
        let rules = if c.last == c.index { c.index.to_string() } else { format!("{}..{}", c.index, c.last) };
        out.push_str(&format!("{}\tegress[{rules}]\t{}\t{}\t{}\n", c.chain, c.verdict, c.packets, c.bytes));
    }
    out
}

/// The rule counters of `chain` of egressd's table, or of the whole table (`None`).
/// A chain that does not exist has none. Read over netlink; should that fail, with `nft`
/// (bounded like every `nft` run, [`super::nft_run::NFT_TIMEOUT`]).
pub fn read(nft: &Path, table: &str, chain: Option<&str>) -> Result<Vec<RuleCounter>, NftError> {
    match super::elements::ElementWriter::open(table).and_then(|mut w| w.rules(chain)) {
        Ok(rules) => return Ok(by_policy_rule(rules)),
        Err(e) => tracing::debug!(error = %e, "rule counters not read over netlink, reading them with nft"),
    }
    read_with_nft(nft, table, chain)
}

/// [`read`] with `nft -j list chain|table`, which reads the whole table first.
pub fn read_with_nft(nft: &Path, table: &str, chain: Option<&str>) -> Result<Vec<RuleCounter>, NftError> {
    use super::nft_run::{NFT_TIMEOUT, stderr_of, wait_within_timeout};
    let mut args = vec!["-j", "list"];
    match chain {
        Some(c) => args.extend(["chain", crate::nft::FAMILY, table, c]),
        None => args.extend(["table", crate::nft::FAMILY, table]),
    }
    let spawn_err = |e: std::io::Error| NftError::Spawn { program: nft.display().to_string(), message: e.to_string() };
    let mut child = Command::new(nft)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    // The output of a big table does not fit the pipe: read it while nft runs.
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(o) = stdout.as_mut() {
            let _ = std::io::Read::read_to_end(o, &mut out);
        }
        out
    });
    let Some(status) = wait_within_timeout(&mut child).map_err(spawn_err)? else {
        return Err(NftError::Timeout { seconds: NFT_TIMEOUT.as_secs() });
    };
    let out = reader.join().unwrap_or_default();
    if status.success() {
        return Ok(parse(&out));
    }
    let stderr = stderr_of(&mut child);
    if stderr.contains("No such file or directory") {
        return Ok(Vec::new());
    }
    Err(NftError::Rejected { message: stderr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_per_rule_and_named_counters_left_out() {
        let json = br#"{"nftables": [{"metainfo": {}}, {"chain": {"name": "fw-a"}},
          {"rule": {"chain": "fw-a", "comment": "egress[0]", "expr": [{"match": {}}, {"counter": "fw-allow"}, {"counter": {"packets": 3, "bytes": 180}}, {"accept": null}]}},
          {"rule": {"chain": "fw-a", "expr": [{"limit": {}}, {"counter": "acl-over"}]}},
          {"rule": {"chain": "fw-a", "comment": "egress[1]", "expr": [{"counter": {"packets": 2, "bytes": 120}}, {"drop": null}]}},
          {"rule": {"chain": "fw-a", "comment": "egress[1]", "expr": [{"counter": {"packets": 5, "bytes": 400}}, {"drop": null}]}},
          {"rule": {"chain": "fw-a", "comment": "egress[2..5]", "expr": [{"counter": {"packets": 4, "bytes": 40}}, {"return": null}]}},
          {"rule": {"chain": "qos-a", "comment": "egress[0]", "expr": [{"mangle": {}}, {"counter": {"packets": 1, "bytes": 60}}, {"return": null}]}}]}"#;
        let c = parse(json);
        let got: Vec<(&str, usize, usize, &str, u64, u64)> =
            c.iter().map(|r| (r.chain.as_str(), r.index, r.last, r.verdict.as_str(), r.packets, r.bytes)).collect();
        assert_eq!(
            got,
            vec![
                ("fw-a", 0, 0, "accept", 3, 180),
                ("fw-a", 1, 1, "drop", 7, 520),
                ("fw-a", 2, 5, "accept", 4, 40),
                ("qos-a", 0, 0, "return", 1, 60)
            ]
        );
        assert!(parse(b"not json").is_empty());
    }
}
