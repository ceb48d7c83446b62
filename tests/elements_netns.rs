//! Element-only changes sent in-process over nf_tables netlink leave the kernel with
//! exactly the table a full replace gives (root required): random sequences of pods
//! coming, going and moving between namespace chains, DNS addresses with timeouts,
//! plain set members, ranges of interval sets (a start element and an interval-end
//! element each, as `nft` writes them) — applied by one syncer as netlink deltas in one namespace and
//! loaded afresh by `nft` in another, then compared as `nft -j list` shows them. No
//! `nft` process runs for those deltas; a delta the kernel refuses is retried as a full
//! replace; a delta larger than the socket's default send buffer is one transaction.
//! The named counters and the rule counters read over netlink are the ones `nft` lists.

mod netns;

use std::collections::BTreeMap;

use egressd::dataplane::nft_cli::NftCli;
use egressd::dataplane::nft_sync::{NftSyncer, SyncKind};
use egressd::nft::{Chain, Data, Hook, KeyType, Set, Slot, Table};
use netns::Netns;
use proptest::prelude::*;

const CHAINS: [&str; 3] = ["fw-a", "fw-b", "fw-h0123456789abcdef"];
const DNS_SLOTS: [Slot; 2] = [Slot { set: "dns-v4", tag: 0xfedc_ba98_7654_3210 }, Slot { set: "dns-v4", tag: 7 }];

fn set(key: KeyType, data: Data, timeout: bool, elements: BTreeMap<String, String>) -> Set {
    let elements = elements.into_iter().map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap())).collect();
    Set { key, data, interval: false, timeout, elements }
}

/// Ranges of the interval sets: the whole space, or prefixes that start at the first
/// address, touch each other, end at the last address, hold one address.
const RANGES4: [&str; 6] =
    ["0.0.0.0/1", "192.0.2.0/25", "192.0.2.128/26", "198.51.100.7/32", "203.0.113.0/24", "240.0.0.0/4"];
const RANGES6: [&str; 4] = ["2001:db8::/32", "2001:db9::/48", "fe80::/10", "ff00::/8"];
/// Pieces of ported sets (`meta l4proto . th dport . ip daddr`, flattened rules): of
/// one protocol and port touching, the whole space, one address.
const PORTED4: [&str; 5] = [
    "tcp . 443 . 192.0.2.0/25",
    "tcp . 443 . 192.0.2.128/26",
    "udp . 53 . 198.51.100.7/32",
    "sctp . 9 . 0.0.0.0/0",
    "tcp . 80 . 192.0.2.0/25",
];
const PORTED6: [&str; 3] = ["tcp . 443 . 2001:db8::/32", "udp . 53 . ::/0", "tcp . 443 . 2001:db9::1/128"];

fn ranges(key: KeyType, ranges: &[&str]) -> Set {
    Set {
        interval: true,
        ..set(key, Data::None, false, ranges.iter().map(|r| (r.to_string(), String::new())).collect())
    }
}

/// The fixed shape (chains, sets, rules) with the given elements, and no ranges.
fn table(pods4: &BTreeMap<u8, usize>, pods6: &BTreeMap<u8, usize>, dns: &BTreeMap<u8, u32>, plain: &[u8]) -> Table {
    with_ported(pods4, pods6, dns, plain, &[], &[], &[], &[])
}

/// The fixed shape with the given elements, ported pieces included.
#[allow(clippy::too_many_arguments)]
fn with_ported(
    pods4: &BTreeMap<u8, usize>,
    pods6: &BTreeMap<u8, usize>,
    dns: &BTreeMap<u8, u32>,
    plain: &[u8],
    ranges4: &[&str],
    ranges6: &[&str],
    ported4: &[&str],
    ported6: &[&str],
) -> Table {
    let mut t = Table::new("egressd");
    t.sets.insert("ranges-v4".into(), ranges(KeyType::Ipv4, ranges4));
    t.sets.insert("ranges-v6".into(), ranges(KeyType::Ipv6, ranges6));
    t.sets.insert("ported-v4".into(), ranges(KeyType::PortIpv4, ported4));
    t.sets.insert("ported-v6".into(), ranges(KeyType::PortIpv6, ported6));
    let jump = |c: &usize| format!("jump {}", CHAINS[*c % CHAINS.len()]);
    // IPv4 pods map to a namespace number (a classid: `0:1`, …) that a second map
    // jumps by, as the firewall's pods do; IPv6 pods jump directly, as EgressQoS's do.
    let number = |c: &usize| format!("0:{}", c % CHAINS.len() + 1);
    t.sets.insert(
        "fw-pods-v4".into(),
        set(
            KeyType::Ipv4,
            Data::Classid,
            false,
            pods4.iter().map(|(i, c)| (format!("198.18.1.{i}"), number(c))).collect(),
        ),
    );
    t.sets.insert(
        "fw-namespaces".into(),
        set(KeyType::Classid, Data::Verdict, false, (0..CHAINS.len()).map(|c| (number(&c), jump(&c))).collect()),
    );
    t.sets.insert(
        "fw-pods-v6".into(),
        set(
            KeyType::Ipv6,
            Data::Verdict,
            false,
            pods6
                .iter()
                .map(|(i, c)| (std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, (*i).into()).to_string(), jump(c)))
                .collect(),
        ),
    );
    // DNS addresses of two names sharing one tagged set (the tags' halves both in use).
    t.sets.insert(
        "dns-v4".into(),
        set(
            KeyType::TaggedIpv4,
            Data::None,
            true,
            dns.iter()
                .map(|(i, s)| {
                    (
                        DNS_SLOTS[usize::from(*i) % 2].key(format!("192.0.2.{i}").parse().unwrap()).to_string(),
                        format!("timeout {s}s"),
                    )
                })
                .collect(),
        ),
    );
    t.sets.insert(
        "snoop-servers-v4".into(),
        set(
            KeyType::Ipv4,
            Data::None,
            false,
            plain.iter().map(|i| (format!("203.0.113.{i}"), String::new())).collect(),
        ),
    );
    for c in CHAINS {
        let rules = [
            format!("{} counter accept", DNS_SLOTS[0].matches("ip")),
            format!("{} counter accept", DNS_SLOTS[1].matches("ip")),
            "ip daddr @ranges-v4 counter accept".to_string(),
            "ip6 daddr @ranges-v6 counter accept".to_string(),
            "meta l4proto . th dport . ip daddr @ported-v4 counter accept".to_string(),
            "meta l4proto . th dport . ip6 daddr @ported-v6 counter accept".to_string(),
            "counter drop".to_string(),
        ];
        t.chains.insert(c.into(), Chain::parsed(rules.iter().map(String::as_str)).unwrap());
    }
    t.chains.insert(
        "firewall".into(),
        Chain::base(
            Hook { chain_type: "filter", hook: "forward", priority: "filter" },
            egressd::nft::rule::parse_all([
                "ip daddr @snoop-servers-v4 accept",
                "meta priority set ip saddr map @fw-pods-v4 meta priority vmap @fw-namespaces",
                "ip6 saddr vmap @fw-pods-v6",
            ])
            .unwrap(),
        ),
    );
    t
}

fn step() -> impl Strategy<Value = Table> {
    (
        proptest::collection::btree_map(0u8..40, 0usize..3, 0..20),
        proptest::collection::btree_map(0u8..40, 0usize..3, 0..10),
        proptest::collection::btree_map(0u8..30, 100u32..400, 0..10),
        proptest::collection::vec(0u8..10, 0..4),
        prop_oneof![
            1 => Just(vec!["0.0.0.0/0"]),
            4 => proptest::sample::subsequence(RANGES4.to_vec(), 0..=RANGES4.len()),
        ],
        prop_oneof![
            1 => Just(vec!["::/0"]),
            4 => proptest::sample::subsequence(RANGES6.to_vec(), 0..=RANGES6.len()),
        ],
        proptest::sample::subsequence(PORTED4.to_vec(), 0..=PORTED4.len()),
        proptest::sample::subsequence(PORTED6.to_vec(), 0..=PORTED6.len()),
    )
        .prop_map(|(p4, p6, dns, plain, r4, r6, o4, o6)| with_ported(&p4, &p6, &dns, &plain, &r4, &r6, &o4, &o6))
}

/// An `nft` that logs each run to `log` (to see whether a delta used it).
fn logging_nft(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let log = dir.join("runs");
    let program = dir.join("nft");
    std::fs::write(&program, format!("#!/bin/sh\necho \"$@\" >> {}\nexec nft \"$@\"\n", log.display())).unwrap();
    std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (program, log)
}

fn runs(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log).map(|s| s.lines().count()).unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn netlink_element_deltas_leave_the_table_a_full_replace_gives(steps in proptest::collection::vec(step(), 1..8)) {
        netns::require_root();
        let (incremental, fresh) = (Netns::new("delta"), Netns::new("fresh"));
        let dir = tempfile::tempdir().unwrap();
        let (program, log) = logging_nft(dir.path());
        let (tx, rx) = std::sync::mpsc::channel::<Option<Table>>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<SyncKind>();
        let path = format!("/run/netns/{}", incremental.name);
        // The incremental syncer lives on a thread inside its namespace (its netlink
        // socket is opened there).
        let worker = std::thread::spawn(move || {
            nix::sched::setns(std::fs::File::open(&path).unwrap(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let mut syncer = NftSyncer::new(NftCli::new(&program));
            while let Ok(Some(t)) = rx.recv() {
                done_tx.send(syncer.sync(t.clone()).expect("sync")).unwrap();
            }
        });
        let first = table(&BTreeMap::from([(1, 0)]), &BTreeMap::new(), &BTreeMap::new(), &[]);
        tx.send(Some(first)).unwrap();
        prop_assert_eq!(done_rx.recv().unwrap(), SyncKind::Full);
        let after_full = runs(&log);
        for t in &steps {
            tx.send(Some(t.clone())).unwrap();
            let kind = done_rx.recv().unwrap();
            let script = t.render();
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &fresh.name, "sh", "-c", "nft delete table inet egressd 2>/dev/null; nft -f -"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut c| {
                    std::io::Write::write_all(c.stdin.as_mut().unwrap(), script.as_bytes())?;
                    drop(c.stdin.take());
                    c.wait()
                })
                .unwrap();
            prop_assert!(out.success(), "fresh load failed:\n{}", script);
            prop_assert_eq!(incremental.table_json("egressd"), fresh.table_json("egressd"), "after a {:?} sync", kind);
            prop_assert_ne!(kind, SyncKind::Full, "a delta was refused");
        }
        prop_assert_eq!(runs(&log), after_full, "element deltas ran nft: {}", std::fs::read_to_string(&log).unwrap_or_default());
        tx.send(None).unwrap();
        worker.join().unwrap();
    }
}

#[test]
fn a_refused_delta_is_retried_in_full_and_a_large_one_is_one_transaction() {
    netns::require_root();
    let ns = Netns::new("elements");
    let desired = |n: usize| {
        let pods: BTreeMap<u8, usize> = (0..40).map(|i| (i, usize::from(i) % 3)).collect();
        let mut t = table(&pods, &BTreeMap::new(), &BTreeMap::from([(1, 300)]), &[1]);
        // n extra IPv6 pods (~120 bytes each as netlink elements).
        let map = t.sets.get_mut("fw-pods-v6").unwrap();
        for i in 0..n {
            let ip = std::net::Ipv6Addr::from(0x2001_0db8_0002_0000_0000_0000_0000_0001u128 + i as u128);
            map.elements.insert(ip.to_string().parse().unwrap(), format!("jump {}", CHAINS[i % 3]).parse().unwrap());
        }
        t
    };
    let (small, large) = (desired(0), desired(20_000));
    let kinds = ns.run(move || {
        let mut syncer = NftSyncer::new(NftCli::new("nft"));
        let mut kinds = vec![syncer.sync(small.clone()).unwrap()];
        // Someone else removes an element the next delta deletes: the kernel refuses
        // the netlink delta, the syncer replaces the table.
        let removed = std::process::Command::new("nft")
            .args(["delete", "element", "inet", "egressd", "fw-pods-v4", "{ 198.18.1.3 }"])
            .status()
            .unwrap();
        assert!(removed.success());
        let mut fewer = small.clone();
        fewer.sets.get_mut("fw-pods-v4").unwrap().elements.remove(&"198.18.1.3".parse().unwrap());
        fewer
            .sets
            .get_mut("fw-pods-v4")
            .unwrap()
            .elements
            .insert("198.18.1.3".parse().unwrap(), "0:2".parse().unwrap());
        kinds.push(syncer.sync(fewer.clone()).unwrap());
        let listed = String::from_utf8(
            std::process::Command::new("nft")
                .args(["list", "map", "inet", "egressd", "fw-pods-v4"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert!(listed.contains("198.18.1.3 : 0:2"), "{listed}");
        // 20,000 map elements (~2.4 MB of netlink messages) in one delta.
        kinds.push(syncer.sync(large.clone()).unwrap());
        kinds.push(syncer.sync(small.clone()).unwrap());
        kinds.push(syncer.sync(large.clone()).unwrap());
        kinds
    });
    // The second sync: a changed verdict is a delete (refused: the element is gone) and
    // an add, so the table is replaced in full.
    assert_eq!(kinds, vec![SyncKind::Full, SyncKind::Full, SyncKind::Partial, SyncKind::Partial, SyncKind::Partial]);
    let listed = ns.exec(&["nft", "list", "map", "inet", "egressd", "fw-pods-v6"]);
    assert_eq!(listed.matches("jump fw-").count(), 20_000, "all 20,000 elements are in the map");
}

#[test]
fn named_counters_read_over_netlink_are_what_nft_lists() {
    netns::require_root();
    let ns = Netns::new("counters");
    let t = table(&BTreeMap::from([(1, 0)]), &BTreeMap::new(), &BTreeMap::new(), &[]);
    let (netlink, cli) = ns.run(move || {
        let mut over_netlink = NftSyncer::new(NftCli::new("nft"));
        let mut through_nft = NftSyncer::new(NftCli::new("nft").with_netlink_elements(false));
        over_netlink.sync(t.clone()).unwrap();
        through_nft.sync(t.clone()).unwrap();
        // Counters with packets, and counters of the same names elsewhere: another
        // family's table of the same name and another inet table.
        let script = "delete counter inet egressd snoop-over-query\n\
                      add counter inet egressd snoop-over-query { packets 17 bytes 1200 }\n\
                      delete counter inet egressd acl-over\n\
                      add counter inet egressd acl-over { packets 7 bytes 300 }\n\
                      add table ip egressd\n\
                      add counter ip egressd snoop-over-query { packets 99 bytes 1 }\n\
                      add table inet other\n\
                      add counter inet other acl-over { packets 55 bytes 1 }\n";
        let mut nft =
            std::process::Command::new("nft").args(["-f", "-"]).stdin(std::process::Stdio::piped()).spawn().unwrap();
        std::io::Write::write_all(nft.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
        drop(nft.stdin.take());
        assert!(nft.wait().unwrap().success());
        let mut netlink = over_netlink.counters().unwrap();
        let mut cli = through_nft.counters().unwrap();
        netlink.sort();
        cli.sort();
        (netlink, cli)
    });
    assert_eq!(netlink, cli, "netlink read vs nft -j list counters");
    assert_eq!(netlink.len(), 11, "the eleven named counters every table declares: {netlink:?}");
    assert!(netlink.contains(&("snoop-over-query".to_string(), 17)), "{netlink:?}");
    assert!(netlink.contains(&("acl-over".to_string(), 7)), "{netlink:?}");
}

#[test]
fn rule_counters_read_over_netlink_are_what_nft_lists() {
    use egressd::dataplane::rule_counters::{read, read_with_nft};
    netns::require_root();
    let ns = Netns::new("rules");
    // Rules as the compiler writes them (a named counter reference, then the rule's own
    // counter), with counts; rules without an `egress[…]` comment are not policy rules.
    let script = r#"table inet egressd {
        counter fw-allow { }
        counter acl-over { }
        chain fw-a {
            ip daddr 192.0.2.0/24 counter name "fw-allow" counter packets 3 bytes 180 accept comment "egress[0]"
            ip daddr 192.0.2.1 limit rate 10/second log prefix "acl a 1 " group 3 counter name "acl-over"
            ip daddr 198.51.100.0/24 counter packets 2 bytes 120 drop comment "egress[1]"
            ip6 daddr 2001:db8::/32 counter packets 5 bytes 400 drop comment "egress[1]"
            ip daddr 203.0.113.0/24 meta l4proto . th dport { tcp . 443, udp . 53 } counter packets 4 bytes 40 accept comment "egress[2..5]"
            ip daddr 203.0.113.7 counter packets 9 bytes 9
        }
        chain qos-a {
            ip daddr 192.0.2.0/24 ip dscp set 46 counter packets 1 bytes 60 return comment "egress[0]"
        }
        chain fw-b {
            ip daddr 192.0.2.9 counter packets 6 bytes 6 accept comment "egress[7]"
        }
    }
    table inet other {
        chain fw-a {
            ip daddr 192.0.2.0/24 counter packets 99 bytes 99 accept comment "egress[0]"
        }
    }"#;
    let got = ns.run(move || {
        let mut nft =
            std::process::Command::new("nft").args(["-f", "-"]).stdin(std::process::Stdio::piped()).spawn().unwrap();
        std::io::Write::write_all(nft.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
        drop(nft.stdin.take());
        assert!(nft.wait().unwrap().success());
        let nft = std::path::Path::new("nft");
        [None, Some("fw-a"), Some("fw-gone")]
            .map(|chain| (read(nft, "egressd", chain).unwrap(), read_with_nft(nft, "egressd", chain).unwrap()))
    });
    for (netlink, cli) in &got {
        assert_eq!(netlink, cli, "netlink read vs nft -j list");
    }
    let fw_a: Vec<_> =
        got[1].0.iter().map(|c| (c.chain.as_str(), c.index, c.last, c.verdict.as_str(), c.packets, c.bytes)).collect();
    assert_eq!(
        fw_a,
        [("fw-a", 0, 0, "accept", 3, 180), ("fw-a", 1, 1, "drop", 7, 520), ("fw-a", 2, 5, "accept", 4, 40)]
    );
    assert_eq!(got[0].0.len(), 5, "the whole table: fw-a, qos-a and fw-b: {:?}", got[0].0);
    assert!(got[2].0.is_empty());
}

#[test]
fn adding_an_element_again_restarts_its_timeout() {
    // DNS snooping re-learns an address with each answer and the DNS proxy refreshes its
    // guard: an add must give the element its full timeout again (the kernel keeps an
    // element's expiry on a plain re-add of the same timeout).
    netns::require_root();
    let ns = Netns::new("refresh");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.nft");
    std::fs::write(
        &file,
        "table inet egressd {\n set dns-v4 { typeof numgen random mod 1 . numgen random mod 1 . ip daddr; flags timeout; }\n}\n",
    )
    .unwrap();
    ns.exec(&["nft", "-f", file.to_str().unwrap()]);
    ns.run(|| {
        let mut w = egressd::dataplane::elements::ElementWriter::open("egressd").unwrap();
        let e = [(DNS_SLOTS[0], "192.0.2.1".parse().unwrap(), std::time::Duration::from_secs(10))];
        w.add(&e).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        w.add(&e).unwrap();
    });
    let listed = ns.exec(&["nft", "list", "set", "inet", "egressd", "dns-v4"]);
    // `timeout 10s expires 9s987ms`: whole seconds left.
    let left: u64 = listed
        .split("expires ")
        .nth(1)
        .and_then(|r| r.split('s').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no expiry listed:\n{listed}"));
    assert!(left >= 9, "the second add did not restart the timeout:\n{listed}");
}
