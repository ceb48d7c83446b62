//! The AWS CloudPrivateIPConfig controller task (the placement leader only).
//!
//! Each round: describe the nodes' instances (one DescribeInstances for all; subnets and
//! instance types once each, kept), publish each node's capacity annotation where it
//! changed, then decide every config ([`super::decide`]) and act: finalizer, at most one
//! EC2 call, status. A round runs on every change of the configs or nodes, every second
//! while something is unsettled, every 30 s otherwise.
//!
//! Failures: a failed describe changes nothing (configs stay as they are: pending stays
//! pending) and is retried after 1, 2, 4 s (at most 5 s); a failed call writes
//! `CloudResponseError` with EC2's code and message and is retried after 1 s, doubling
//! up to 30 s per IP. Nothing is kept but caches: after a restart or a leader change the
//! next round reads EC2 and the configs again and carries on.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;

use super::credentials::{CredentialChain, Source};
use super::ec2::{Ec2, Ec2Error};
use super::{Call, Inventory, NodeCloud, decide, ipconfig_annotation, parse_provider_id, region_of_zone};
use crate::leader::Leadership;
use crate::placement::cloud::{self, ConfigStatus, Pending};
use crate::view::NodeInfo;
use crate::view::policy::CloudPrivateIp;

/// Settings of `--cloud-provider aws`.
#[derive(Debug, Clone, Default)]
pub struct AwsSettings {
    /// `--cloud-endpoint`: the EC2 endpoint (default `https://ec2.<region>.amazonaws.com/`;
    /// the region: `AWS_REGION`, `AWS_DEFAULT_REGION`, else the nodes' zone).
    pub endpoint: Option<String>,
}

/// What the task needs of each view.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Input {
    /// Nodes by name.
    pub nodes: BTreeMap<String, NodeInfo>,
    /// The configs.
    pub configs: Vec<CloudPrivateIp>,
}

/// Start the task; send it the view.
pub fn start(client: Client, settings: AwsSettings, leadership: Leadership) -> watch::Sender<Option<Arc<Input>>> {
    let (tx, rx) = watch::channel(None);
    let span = tracing::info_span!("aws");
    tokio::spawn(tracing::Instrument::instrument(run(client, settings, leadership, rx), span));
    tx
}

/// Backoff: 1 s, doubling, at most `max`.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    until: Instant,
    delay: Duration,
}

impl Backoff {
    fn next(prev: Option<Backoff>, max: Duration) -> Backoff {
        let delay = prev.map_or(Duration::from_secs(1), |b| (b.delay * 2).min(max));
        Backoff { until: Instant::now() + delay, delay }
    }
}

#[derive(Default)]
struct State {
    ec2: Option<Ec2>,
    subnets: BTreeMap<String, Vec<ipnet::IpNet>>,
    limits: BTreeMap<String, super::ec2::Limits>,
    describe_backoff: Option<Backoff>,
    call_backoff: BTreeMap<IpAddr, Backoff>,
    pending: Pending,
    /// Annotations written and not yet seen: node → value.
    annotated: BTreeMap<String, (String, Instant)>,
    last_error: Option<String>,
}

async fn run(
    client: Client,
    settings: AwsSettings,
    leadership: Leadership,
    mut rx: watch::Receiver<Option<Arc<Input>>>,
) {
    let mut st = State::default();
    let mut wait = Duration::from_secs(1);
    loop {
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            () = tokio::time::sleep(wait) => {}
        }
        let Some(input) = rx.borrow_and_update().clone() else { continue };
        if !leadership.is_leader() {
            st.pending.clear();
            st.annotated.clear();
            wait = Duration::from_secs(1);
            continue;
        }
        wait = round(&client, &settings, &leadership, &input, &mut st).await;
    }
}

/// One round; how long until the next.
async fn round(
    client: &Client,
    settings: &AwsSettings,
    leadership: &Leadership,
    input: &Input,
    st: &mut State,
) -> Duration {
    if let Some(b) = st.describe_backoff
        && Instant::now() < b.until
    {
        return b.until - Instant::now();
    }
    let inv = match described(settings, input, st).await {
        Ok(inv) => inv,
        Err(wait) => return wait,
    };
    let config_ips: BTreeSet<IpAddr> = input.configs.iter().map(|c| c.ip).collect();
    publish_capacity(client, leadership, input, &inv, &config_ips, st).await;
    let node_exists = |n: &str| input.nodes.contains_key(n);
    let mut unsettled = false;
    for c in &input.configs {
        let d = decide(c, &inv, &node_exists);
        if d.call.is_some() || d.finalizer.is_some() {
            unsettled = true;
        }
        if !leadership.is_leader() {
            return Duration::from_secs(1);
        }
        carry_out(client, c, d, st).await;
    }
    st.call_backoff.retain(|ip, _| config_ips.contains(ip));
    if unsettled { Duration::from_secs(1) } else { Duration::from_secs(30) }
}

/// The nodes' instances as EC2 describes them, or how long to wait after an error (which
/// is logged once while it lasts).
async fn described(settings: &AwsSettings, input: &Input, st: &mut State) -> Result<Inventory, Duration> {
    match inventory(settings, input, st).await {
        Ok(inv) => {
            st.describe_backoff = None;
            if st.last_error.take().is_some() {
                tracing::info!("EC2 answers again");
            }
            Ok(inv)
        }
        Err(e) => {
            let b = Backoff::next(st.describe_backoff, Duration::from_secs(5));
            st.describe_backoff = Some(b);
            let text = e.to_string();
            if st.last_error.as_deref() != Some(&text) {
                tracing::warn!(error = %text, retry_in = ?b.delay, "EC2 not described; configs wait");
            }
            st.last_error = Some(text);
            Err(b.delay)
        }
    }
}

/// Carry out decision `d` for config `c`: the finalizer, the EC2 call (unless it backs
/// off), the status.
async fn carry_out(client: &Client, c: &CloudPrivateIp, d: super::Decision, st: &mut State) {
    if let Some(add) = d.finalizer
        && st.pending.take(cloud::key(c.ip, "finalizer", &json!(add)), Duration::from_secs(2))
    {
        match cloud::set_finalizer(client, c.ip, add).await {
            Ok(()) => tracing::info!(ip = %c.ip, add, "CloudPrivateIPConfig finalizer updated"),
            Err(e) => {
                tracing::warn!(ip = %c.ip, error = %e, "CloudPrivateIPConfig finalizer not updated; will retry")
            }
        }
    }
    let mut status = d.status;
    if let Some(call) = &d.call {
        if st.call_backoff.get(&c.ip).is_some_and(|b| Instant::now() < b.until) {
            return;
        }
        match execute(st, call).await {
            Ok(()) => {
                st.call_backoff.remove(&c.ip);
                tracing::info!(call = ?call, "EC2 call done");
            }
            Err(e) => {
                let b = Backoff::next(st.call_backoff.get(&c.ip).copied(), Duration::from_secs(30));
                st.call_backoff.insert(c.ip, b);
                tracing::warn!(call = ?call, error = %e, retry_in = ?b.delay, "EC2 call failed");
                let s = call_failed(call, &e);
                status = (!s.matches(c)).then_some(s);
            }
        }
    }
    if let Some(s) = status {
        let k = json!([s.node, s.status, s.reason, s.message]);
        if st.pending.take(cloud::key(c.ip, "status", &k), Duration::from_secs(2)) {
            match cloud::write_status(client, c.ip, &s).await {
                Ok(()) => {
                    tracing::info!(ip = %c.ip, node = ?s.node, reason = s.reason, message = %s.message, "CloudPrivateIPConfig status written")
                }
                Err(e) => {
                    tracing::warn!(ip = %c.ip, error = %e, "CloudPrivateIPConfig status not written; will retry")
                }
            }
        }
    }
}

/// The status of a config whose call failed: `CloudResponseError`, the call and EC2's
/// code and message.
fn call_failed(call: &Call, e: &Ec2Error) -> ConfigStatus {
    ConfigStatus { node: None, status: "False", reason: cloud::ERROR, message: format!("{}: {e}", call_name(call)) }
}

fn call_name(call: &Call) -> &'static str {
    match call {
        Call::Assign { ip: IpAddr::V4(_), .. } => "AssignPrivateIpAddresses",
        Call::Assign { .. } => "AssignIpv6Addresses",
        Call::Unassign { ip: IpAddr::V4(_), .. } => "UnassignPrivateIpAddresses",
        Call::Unassign { .. } => "UnassignIpv6Addresses",
    }
}

async fn execute(st: &State, call: &Call) -> Result<(), Ec2Error> {
    let Some(ec2) = &st.ec2 else { return Err(Ec2Error::new("Config", "no EC2 client")) };
    match call {
        Call::Assign { interface, ip, reassign, .. } => ec2.assign(interface, *ip, *reassign).await,
        Call::Unassign { interface, ip, .. } => ec2.unassign(interface, *ip).await,
    }
}

/// Describe every AWS node (creating the client on first use: the region comes from the
/// nodes' zone).
async fn inventory(settings: &AwsSettings, input: &Input, st: &mut State) -> Result<Inventory, Ec2Error> {
    let mut inv = Inventory::default();
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    let mut zone = None;
    for (name, info) in &input.nodes {
        match info.provider_id.as_deref().and_then(parse_provider_id) {
            Some((z, id)) => {
                zone = zone.or(z);
                ids.insert(id, name.clone());
            }
            None => {
                inv.missing.insert(name.clone(), "no AWS spec.providerID (aws:///<zone>/<instance-id>)".into());
            }
        }
    }
    if ids.is_empty() {
        return Ok(inv);
    }
    if st.ec2.is_none() {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| zone.as_deref().and_then(region_of_zone))
            .ok_or_else(|| {
                Ec2Error::new("Config", "no region: no node's providerID names a zone and AWS_REGION is unset")
            })?;
        let source = Source::from_env(&|k| std::env::var(k).ok(), &region);
        tracing::info!(region = %region, credentials = %source.describe(), endpoint = ?settings.endpoint, "EC2 client");
        st.ec2 = Some(Ec2::new(&region, settings.endpoint.as_deref(), Arc::new(CredentialChain::new(source)?))?);
    }
    let Some(ec2) = st.ec2.clone() else { return Ok(inv) };
    let list: Vec<String> = ids.keys().cloned().collect();
    let instances = ec2.describe_instances(&list).await?;
    let new_subnets: BTreeSet<String> = instances
        .iter()
        .filter_map(|i| i.interface.as_ref().map(|n| n.subnet.clone()))
        .filter(|s| !s.is_empty() && !st.subnets.contains_key(s))
        .collect();
    if !new_subnets.is_empty() {
        let list: Vec<String> = new_subnets.into_iter().collect();
        st.subnets.extend(ec2.describe_subnets(&list).await?);
    }
    let new_types: BTreeSet<String> =
        instances.iter().map(|i| i.instance_type.clone()).filter(|t| !st.limits.contains_key(t)).collect();
    if !new_types.is_empty() {
        let list: Vec<String> = new_types.into_iter().collect();
        st.limits.extend(ec2.describe_instance_types(&list).await?);
    }
    let mut found = BTreeSet::new();
    for i in instances {
        let Some(name) = ids.get(&i.id) else { continue };
        found.insert(i.id.clone());
        let Some(n) = i.interface else {
            inv.missing.insert(name.clone(), format!("instance {} has no primary network interface", i.id));
            continue;
        };
        inv.nodes.insert(
            name.clone(),
            NodeCloud {
                instance: i.id,
                interface: n.id,
                subnets: st.subnets.get(&n.subnet).cloned().unwrap_or_default(),
                addresses: n.addresses.into_iter().collect(),
                limits: st.limits.get(&i.instance_type).copied().unwrap_or((0, 0)),
            },
        );
    }
    for (id, name) in ids {
        if !found.contains(&id) {
            inv.missing.insert(name, format!("instance {id} not found in EC2 ({})", ec2.region()));
        }
    }
    Ok(inv)
}

/// Write each AWS node's capacity annotation where it differs.
async fn publish_capacity(
    client: &Client,
    leadership: &Leadership,
    input: &Input,
    inv: &Inventory,
    config_ips: &BTreeSet<IpAddr>,
    st: &mut State,
) {
    let api: Api<Node> = Api::all(client.clone());
    for (name, nc) in &inv.nodes {
        let value = ipconfig_annotation(nc, config_ips);
        let now = input.nodes.get(name).and_then(|n| n.cloud_ipconfig_raw.as_deref());
        if now == Some(value.as_str()) {
            st.annotated.remove(name);
            continue;
        }
        if st.annotated.get(name).is_some_and(|(v, t)| *v == value && t.elapsed() < Duration::from_secs(5)) {
            continue;
        }
        if !leadership.is_leader() {
            return;
        }
        let patch = json!({ "metadata": { "annotations": { super::IPCONFIG_ANNOTATION: value } } });
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::info!(node = %name, value = %value, "published the node's egress IP capacity");
                st.annotated.insert(name.clone(), (value, Instant::now()));
            }
            Err(e) => tracing::warn!(node = %name, error = %e, "capacity annotation not written; will retry"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_is_an_error_status_with_ec2s_reason() {
        let call = Call::Assign {
            node: "b".into(),
            interface: "eni-1".into(),
            ip: "198.19.0.100".parse().unwrap(),
            reassign: true,
        };
        let e = super::super::http::parse_error(
            400,
            "<Response><Errors><Error><Code>PrivateIpAddressLimitExceeded</Code><Message>Number of private addresses will exceed limit.</Message></Error></Errors></Response>",
        );
        let s = call_failed(&call, &e);
        assert_eq!((s.node, s.status, s.reason), (None, "False", "CloudResponseError"));
        assert_eq!(
            s.message,
            "AssignPrivateIpAddresses: PrivateIpAddressLimitExceeded: Number of private addresses will exceed limit."
        );
        let v6 = Call::Unassign { node: "b".into(), interface: "eni-1".into(), ip: "2001:db8::1".parse().unwrap() };
        assert!(
            call_failed(&v6, &Ec2Error::new("Timeout", "no answer"))
                .message
                .starts_with("UnassignIpv6Addresses: Timeout")
        );
    }

    #[test]
    fn backoff_doubles_from_a_second_up_to_its_cap() {
        let mut b = None;
        let mut delays = Vec::new();
        for _ in 0..7 {
            let next = Backoff::next(b, Duration::from_secs(30));
            delays.push(next.delay.as_secs());
            b = Some(next);
        }
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30]);
        assert!(b.unwrap().until > Instant::now() + Duration::from_secs(29));
    }
}
