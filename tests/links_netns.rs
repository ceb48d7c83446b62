//! The links egressd reads before each compile (`Netlink::links`: links, their
//! addresses, the main table's default routes), kept until a route netlink
//! notification touches them, are exactly what a fresh read gives (root required):
//! random sequences of links coming, going, going up and down, addresses of the node's
//! and of egressd's own (its address protocol), default routes and routes of other
//! tables, rules — after each step, the cached read and a read by a new handle are
//! compared. Steps that touch nothing the links read (another table's route, a rule,
//! one of egressd's addresses) do not dump them.

mod netns;

use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use egressd::dataplane::netlink::Netlink;
use egressd::net::EgressSettings;
use netns::Netns;
use proptest::prelude::*;

/// One change, made with `ip` (egressd's own addresses with rtnetlink: `ip` cannot set
/// an address's protocol).
#[derive(Debug, Clone)]
enum Step {
    /// A veth pair `ega<i>`/`egb<i>`.
    AddPair(u8),
    DelPair(u8),
    /// Both ends up, or `ega<i>` down.
    Up(u8),
    Down(u8),
    /// The node's address `198.18.<i>.<host>/24` on `ega<i>`, or `2001:db8:<i>::<host>/64`.
    Address {
        pair: u8,
        host: u8,
        v6: bool,
    },
    DelAddress {
        pair: u8,
        host: u8,
        v6: bool,
    },
    /// egressd's address `198.18.<i>.<host>/32` on `ega<i>` (its protocol).
    OwnAddress {
        pair: u8,
        host: u8,
    },
    /// The main table's default route via `ega<i>` with a metric.
    Default {
        pair: u8,
        metric: u8,
        v6: bool,
    },
    DelDefault {
        metric: u8,
        v6: bool,
    },
    /// A route of the main table that is no default, and one of table 100.
    Route {
        pair: u8,
        table: bool,
    },
    /// A policy rule.
    Rule(u8),
}

/// What a step touches of what the links read.
fn touches_links(step: &Step) -> bool {
    !matches!(step, Step::OwnAddress { .. } | Step::Route { table: true, .. } | Step::Rule(_))
}

fn step() -> impl Strategy<Value = Step> {
    let pair = 0u8..3;
    prop_oneof![
        3 => pair.clone().prop_map(Step::AddPair),
        1 => pair.clone().prop_map(Step::DelPair),
        2 => pair.clone().prop_map(Step::Up),
        1 => pair.clone().prop_map(Step::Down),
        3 => (pair.clone(), 1u8..4, any::<bool>()).prop_map(|(pair, host, v6)| Step::Address { pair, host, v6 }),
        1 => (pair.clone(), 1u8..4, any::<bool>()).prop_map(|(pair, host, v6)| Step::DelAddress { pair, host, v6 }),
        2 => (pair.clone(), 10u8..13).prop_map(|(pair, host)| Step::OwnAddress { pair, host }),
        2 => (pair.clone(), 1u8..3, any::<bool>()).prop_map(|(pair, metric, v6)| Step::Default { pair, metric, v6 }),
        1 => (1u8..3, any::<bool>()).prop_map(|(metric, v6)| Step::DelDefault { metric, v6 }),
        2 => (pair.clone(), any::<bool>()).prop_map(|(pair, table)| Step::Route { pair, table }),
        1 => pair.prop_map(Step::Rule),
    ]
}

/// `ip ARGS` in the calling thread's namespace; failures (a link that is not there)
/// are part of the game.
fn ip(args: &[&str]) {
    let _ = Command::new("ip").args(args).output();
}

async fn own_address(pair: u8, host: u8, settings: &EgressSettings) {
    use futures::TryStreamExt;
    use netlink_packet_route::address::{AddressAttribute, AddressProtocol};
    let (connection, handle, _) = rtnetlink::new_connection().unwrap();
    tokio::spawn(connection);
    let Ok(Some(link)) = handle.link().get().match_name(format!("ega{pair}")).execute().try_next().await else {
        return;
    };
    let ip: IpAddr = format!("198.18.{pair}.{host}").parse().unwrap();
    let mut req = handle.address().add(link.header.index, ip, 32);
    req.message_mut().attributes.push(AddressAttribute::Protocol(AddressProtocol::from(settings.address_protocol)));
    let _ = req.execute().await;
}

async fn apply(step: &Step, settings: &EgressSettings) {
    match step.clone() {
        Step::AddPair(i) => {
            ip(&["link", "add", &format!("ega{i}"), "type", "veth", "peer", "name", &format!("egb{i}")])
        }
        Step::DelPair(i) => ip(&["link", "del", &format!("ega{i}")]),
        Step::Up(i) => {
            ip(&["link", "set", &format!("ega{i}"), "up"]);
            ip(&["link", "set", &format!("egb{i}"), "up"]);
        }
        Step::Down(i) => ip(&["link", "set", &format!("ega{i}"), "down"]),
        Step::Address { pair, host, v6 } | Step::DelAddress { pair, host, v6 } => {
            let verb = if matches!(step, Step::Address { .. }) { "add" } else { "del" };
            let address = if v6 { format!("2001:db8:{pair}::{host}/64") } else { format!("198.18.{pair}.{host}/24") };
            let mut args = vec!["addr", verb, address.as_str(), "dev"];
            let dev = format!("ega{pair}");
            args.push(&dev);
            if v6 {
                args.push("nodad");
            }
            ip(&args);
        }
        Step::OwnAddress { pair, host } => own_address(pair, host, settings).await,
        Step::Default { pair, metric, v6 } => {
            let (family, via) =
                if v6 { ("-6", format!("2001:db8:{pair}::fe")) } else { ("-4", format!("198.18.{pair}.254")) };
            let metric = metric.to_string();
            ip(&[
                family,
                "route",
                "add",
                "default",
                "via",
                &via,
                "dev",
                &format!("ega{pair}"),
                "metric",
                &metric,
                "onlink",
            ]);
        }
        Step::DelDefault { metric, v6 } => {
            let family = if v6 { "-6" } else { "-4" };
            ip(&[family, "route", "del", "default", "metric", &metric.to_string()]);
        }
        Step::Route { pair, table } => {
            let dev = format!("ega{pair}");
            let dst = format!("203.0.113.{}/32", pair + 1);
            let mut args = vec!["route", "add", dst.as_str(), "dev", dev.as_str()];
            if table {
                args.extend(["table", "100"]);
            }
            ip(&args);
        }
        Step::Rule(i) => ip(&["rule", "add", "fwmark", &(u32::from(i) + 1).to_string(), "table", "100"]),
    }
}

/// How long the cache may lag a fresh read: the time the kernel takes to send a
/// notification it sends after the change's call returned.
const NOTIFICATION_WAIT: Duration = Duration::from_secs(2);

fn check(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let ns = Netns::new("links");
    let outcome = ns.run(move || -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let settings = EgressSettings::default();
            let cached = Netlink::connect(settings.clone()).map_err(|e| e.to_string())?;
            cached.set_links_settle(Duration::ZERO);
            cached.links().await.map_err(|e| e.to_string())?;
            for (i, step) in steps.iter().enumerate() {
                apply(step, &settings).await;
                let dumps = cached.links_dumps().ok_or("no link notifications")?;
                let fresh = Netlink::connect(settings.clone()).map_err(|e| e.to_string())?;
                let want = fresh.links().await.map_err(|e| e.to_string())?;
                // The kernel announces an IPv6 address from its address work, after
                // `ip` returned: until that notification arrives the cache may hold
                // the links before the change. Once it has, the cache must be exact.
                let deadline = std::time::Instant::now() + NOTIFICATION_WAIT;
                loop {
                    let got = cached.links().await.map_err(|e| e.to_string())?;
                    if got == want {
                        break;
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(format!(
                            "after step {i} ({step:?}) of {steps:?}, {NOTIFICATION_WAIT:?} later:\ncached {got:#?}\nfresh {want:#?}"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let dumped = cached.links_dumps().ok_or("no link notifications")? > dumps;
                if !touches_links(step) && dumped {
                    return Err(format!("step {i} ({step:?}) touches nothing the links read, yet they were dumped"));
                }
            }
            Ok(())
        })
    });
    drop(ns);
    outcome.map_err(TestCaseError::fail)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn cached_links_are_what_a_fresh_read_gives(steps in prop::collection::vec(step(), 1..30)) {
        check(steps)?;
    }
}
