//! The placement task (Kubernetes mode, every agent).
//!
//! Every agent: publishes the subnets of its up links on its own Node
//! ([`crate::view::EGRESS_SUBNETS_ANNOTATION`]) whenever they change, so the leader knows
//! which node can host which egress IP.
//!
//! The leader only ([`Leadership::is_leader`], checked right before each write):
//! * probes every node labelled `k8s.ovn.org/egress-assignable` on
//!   `--egress-ip-health-port` (every `--egress-ip-probe-interval-ms`, each probe bounded
//!   by `--egress-ip-probe-timeout-ms`; `--egress-ip-probe-misses` misses in a row make a
//!   node Down, one answer makes it Up);
//! * plans ([`super::plan`]) on every change of the view (EgressIPs, Nodes: readiness,
//!   labels, deletion, subnets) and of a probe verdict, and writes the `status.items`
//!   that differ: a get, then an update of the whole object with its `resourceVersion`
//!   (EgressIP has no status subresource); a conflict or a view that is behind the
//!   object just waits for the watch to bring the news;
//! * records the plan's Events, once per distinct message.
//!
//! A new leader starts with every node Unknown: existing items stay (adopted) until a
//! probe finds their node Down.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{Candidate, Placement, PlacementEvent, Reach, Request, allocators, cloud, plan_with};
use crate::api::{Kind, ObjectKey};
use crate::compile::Desired;
use crate::leader::Leadership;
use crate::net::{EgressIpMode, HostLinks};
use crate::status::StatusSink;
use crate::view::policy::{CloudPrivateIp, EgressIpPolicy};
use crate::view::{ClusterView, EGRESS_ASSIGNABLE_LABEL, EGRESS_SUBNETS_ANNOTATION, NodeInfo};

/// EgressIP updates in flight at once (a failover moves many).
const WRITES_AT_ONCE: usize = 16;

/// Placement settings.
#[derive(Debug, Clone)]
pub struct PlacementSettings {
    /// This node.
    pub node: String,
    /// The health port every agent serves and the leader probes (0: no probing, nodes
    /// count as reachable).
    pub health_port: u16,
    /// How often the leader probes each node.
    pub probe_interval: Duration,
    /// How long one probe may take.
    pub probe_timeout: Duration,
    /// Misses in a row that make a node Down.
    pub probe_misses: u32,
    /// Pod networks: subnets inside them are never published as hosting subnets.
    pub cluster_cidrs: Vec<IpNet>,
    /// `--egress-ip-mode`.
    pub mode: EgressIpMode,
    /// `--cloud-provider aws`: the leader is the CloudPrivateIPConfig controller.
    pub aws: Option<crate::aws::controller::AwsSettings>,
    /// Where this node publishes its hosting subnets.
    pub subnets_on: SubnetsOn,
}

/// Where a node agent publishes its hosting subnets ([`EGRESS_SUBNETS_ANNOTATION`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubnetsOn {
    /// Its Node (the node identity patches Nodes).
    Node,
    /// Its own pod (namespace, name): the controller copies the annotation onto the Node
    /// ([`super::relay`]), so node credentials need not write Nodes (the split layout).
    Pod(String, String),
}

/// What the task needs of each applied state.
#[derive(Debug, Default)]
struct Snapshot {
    nodes: Arc<BTreeMap<String, NodeInfo>>,
    /// Oldest first: (name, policy, currently rejected).
    egress_ips: Vec<(String, EgressIpPolicy, bool)>,
    links: Option<HostLinks>,
    /// CloudPrivateIPConfigs (valid ones).
    cloud_ips: Vec<CloudPrivateIp>,
    /// The egress IPs and cloud IPs on this node after the last sync, when it succeeded
    /// (`None`: it failed, nothing is known).
    hosted: Option<BTreeSet<IpAddr>>,
    /// Why this node could not host a CloudPrivateIPConfig naming it (`cloud-local`).
    cloud_problems: BTreeMap<IpAddr, String>,
}

/// Feeds the placement task (a [`StatusSink`]).
pub struct PlacementSink {
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    aws: Option<watch::Sender<Option<Arc<crate::aws::controller::Input>>>>,
    nodes: crate::status::SharedNodes,
}

impl PlacementSink {
    /// Start the task; `nodes`: the copy of the nodes shared with the other sink.
    pub fn start(
        client: Client,
        settings: PlacementSettings,
        leadership: Leadership,
        nodes: crate::status::SharedNodes,
    ) -> Self {
        let (tx, rx) = watch::channel(None);
        let aws = settings.aws.clone().map(|s| crate::aws::controller::start(client.clone(), s, leadership.clone()));
        let span = tracing::info_span!("placement", node = %settings.node);
        tokio::spawn(tracing::Instrument::instrument(run(client, settings, leadership, rx), span));
        Self { tx, aws, nodes }
    }
}

impl StatusSink for PlacementSink {
    fn applied(&mut self, view: &ClusterView, desired: &Desired, links: Option<&HostLinks>) {
        let mut egress_ips: Vec<(String, EgressIpPolicy, bool)> = view
            .egress_ips
            .values()
            .filter_map(|e| e.policy.as_deref().map(|p| (e.key.name.to_string(), p.clone(), e.error.is_some())))
            .collect();
        egress_ips.sort_by(|a, b| {
            (a.1.created.is_none(), a.1.created, &a.0).cmp(&(b.1.created.is_none(), b.1.created, &b.0))
        });
        let kernel_failed = desired
            .statuses
            .iter()
            .any(|s| matches!(&s.outcome, crate::compile::Outcome::Failed(r) if r.contains("kernel error")));
        let hosted = (!kernel_failed).then(|| desired.net.addresses.keys().copied().collect());
        let cloud_problems = desired
            .statuses
            .iter()
            .filter(|s| s.key.kind == Kind::CloudPrivateIPConfig)
            .filter_map(|s| match &s.outcome {
                crate::compile::Outcome::Failed(r) => {
                    crate::view::policy::cloud_private_ip_from_name(&s.key.name).map(|ip| (ip, r.clone()))
                }
                _ => None,
            })
            .collect();
        let snap = Snapshot {
            nodes: self.nodes.of(view),
            egress_ips,
            links: links.cloned(),
            cloud_ips: view.cloud_ips.values().filter_map(|e| e.policy.as_deref().cloned()).collect(),
            hosted,
            cloud_problems,
        };
        if let Some(aws) = &self.aws {
            // Copied only when the nodes or configs changed.
            aws.send_if_modified(|now| {
                let same = now.as_deref().is_some_and(|i| i.nodes == *snap.nodes && i.configs == snap.cloud_ips);
                if !same {
                    let input = crate::aws::controller::Input {
                        nodes: BTreeMap::clone(&snap.nodes),
                        configs: snap.cloud_ips.clone(),
                    };
                    *now = Some(Arc::new(input));
                }
                !same
            });
        }
        let _ = self.tx.send(Some(Arc::new(snap)));
    }
}

/// The subnets of the node's up links that may host egress IPs: not host routes, not
/// link-local or loopback, not inside the pod networks; sorted.
pub(crate) fn hosting_subnets(links: &HostLinks, cluster: &[IpNet]) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = links
        .links
        .iter()
        .filter(|l| l.up)
        .flat_map(|l| l.addrs.iter())
        .filter(|n| n.prefix_len() < n.max_prefix_len())
        .filter(|n| match n.addr() {
            IpAddr::V4(a) => !a.is_loopback() && !a.is_link_local(),
            IpAddr::V6(a) => !a.is_loopback() && !a.is_unicast_link_local(),
        })
        .map(IpNet::trunc)
        .filter(|n| !cluster.iter().any(|c| c.contains(n)))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Per node: the probe verdict and the misses in a row.
#[derive(Debug, Clone, Copy)]
struct Probed {
    reach: Reach,
    misses: u32,
    last_start: Option<Instant>,
    in_flight: bool,
}

impl Default for Probed {
    fn default() -> Self {
        Self { reach: Reach::Unknown, misses: 0, last_start: None, in_flight: false }
    }
}

/// The address the leader probes a node on (IPv4 first).
fn probe_addr(node: &NodeInfo, port: u16) -> Option<SocketAddr> {
    node.addresses.iter().min_by_key(|a| a.is_ipv6()).map(|a| SocketAddr::new(*a, port))
}

fn item_set(items: &[(IpAddr, String)]) -> BTreeSet<(IpAddr, String)> {
    items.iter().cloned().collect()
}

/// The task's state between rounds.
struct State {
    probed: BTreeMap<String, Probed>,
    probes: JoinSet<(String, bool)>,
    /// Items written (or tried) and not yet seen in the view: name → (items, not
    /// again before). Bounds retries: a written plan waits for its echo, a refused one
    /// (the view was behind, 409) for a moment, a failing API for longer.
    written: BTreeMap<String, (BTreeSet<(IpAddr, String)>, Instant)>,
    /// Events recorded: name → (reason, message).
    evented: BTreeMap<String, BTreeSet<(&'static str, String)>>,
    /// The subnets last published on this node, and when.
    published: Option<(Vec<IpNet>, Instant)>,
    was_leader: bool,
    /// CloudPrivateIPConfig writes of this node (`cloud-local`) and of the leader, not
    /// repeated while their echo is on its way.
    cloud_node: cloud::Pending,
    cloud_leader: cloud::Pending,
    /// Addresses whereabouts IPPools and IPAMClaims hold, and when they were listed.
    held: BTreeMap<IpAddr, String>,
    held_at: Option<Instant>,
}

async fn run(
    client: Client,
    settings: PlacementSettings,
    leadership: Leadership,
    mut rx: watch::Receiver<Option<Arc<Snapshot>>>,
) {
    let mut st = State {
        probed: BTreeMap::new(),
        probes: JoinSet::new(),
        written: BTreeMap::new(),
        evented: BTreeMap::new(),
        published: None,
        was_leader: false,
        cloud_node: cloud::Pending::default(),
        cloud_leader: cloud::Pending::default(),
        held: BTreeMap::new(),
        held_at: None,
    };
    let every = settings.probe_interval.min(Duration::from_millis(500));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
            Some(done) = st.probes.join_next(), if !st.probes.is_empty() => {
                if let Ok((node, ok)) = done {
                    probe_done(&mut st, &settings, &node, ok);
                }
            }
        }
        let Some(snap) = rx.borrow_and_update().clone() else { continue };
        publish_subnets(&client, &settings, &snap, &mut st).await;
        if settings.mode == EgressIpMode::CloudLocal {
            cloud_node(&client, &settings, &snap, &mut st).await;
        }
        if !leadership.is_leader() {
            if st.was_leader {
                st.probes.abort_all();
                st.probed.clear();
                st.written.clear();
                st.evented.clear();
                st.cloud_leader.clear();
                st.held.clear();
                st.held_at = None;
                st.was_leader = false;
            }
            continue;
        }
        st.was_leader = true;
        if st.held_at.is_none_or(|t| t.elapsed() >= allocators::REFRESH) {
            let held = allocators::holders(&client).await;
            if held != st.held {
                tracing::info!(addresses = held.len(), "addresses held by IPPools and IPAMClaims");
            }
            st.held = held;
            st.held_at = Some(Instant::now());
        }
        start_probes(&mut st, &settings, &snap);
        place(&client, &settings, &leadership, &snap, &mut st).await;
    }
}

fn probe_done(st: &mut State, settings: &PlacementSettings, node: &str, ok: bool) {
    let Some(p) = st.probed.get_mut(node) else { return };
    p.in_flight = false;
    let before = p.reach;
    if ok {
        p.misses = 0;
        p.reach = Reach::Up;
    } else {
        p.misses = p.misses.saturating_add(1);
        if p.misses >= settings.probe_misses {
            p.reach = Reach::Down;
        }
    }
    if before != p.reach {
        match p.reach {
            Reach::Down => tracing::warn!(node, misses = p.misses, "egress node unreachable (health probe)"),
            _ => tracing::info!(node, "egress node reachable (health probe)"),
        }
    }
}

/// Probe the labelled nodes whose last probe started at least an interval ago and has
/// finished.
fn start_probes(st: &mut State, settings: &PlacementSettings, snap: &Snapshot) {
    let labelled: BTreeSet<&String> =
        snap.nodes.iter().filter(|(_, n)| n.labels.contains_key(EGRESS_ASSIGNABLE_LABEL)).map(|(k, _)| k).collect();
    st.probed.retain(|n, _| labelled.contains(n));
    let now = Instant::now();
    for name in labelled {
        let p = st.probed.entry(name.clone()).or_default();
        if settings.health_port == 0 {
            p.reach = Reach::Up;
            continue;
        }
        if p.in_flight || p.last_start.is_some_and(|t| now.duration_since(t) < settings.probe_interval) {
            continue;
        }
        let Some(addr) = probe_addr(&snap.nodes[name], settings.health_port) else { continue };
        p.in_flight = true;
        p.last_start = Some(now);
        let timeout = settings.probe_timeout;
        let node = name.clone();
        st.probes.spawn(async move { (node, super::health::probe(addr, timeout).await) });
    }
}

/// Publish this node's hosting subnets when they differ from what its Node says (and
/// were not just written: the echo takes a moment).
async fn publish_subnets(client: &Client, settings: &PlacementSettings, snap: &Snapshot, st: &mut State) {
    let Some(links) = &snap.links else { return };
    let Some(me) = snap.nodes.get(&settings.node) else { return };
    let subnets = hosting_subnets(links, &settings.cluster_cidrs);
    // On the pod, what was written stays: the Node follows when the controller copies it.
    let on_pod = matches!(settings.subnets_on, SubnetsOn::Pod(..));
    if me.egress_subnets == subnets && !on_pod {
        st.published = None;
        return;
    }
    if st.published.as_ref().is_some_and(|(s, t)| *s == subnets && (on_pod || t.elapsed() < Duration::from_secs(5))) {
        return;
    }
    let text = serde_json::to_string(&subnets.iter().map(ToString::to_string).collect::<Vec<_>>())
        .unwrap_or_else(|_| "[]".into());
    let patch = json!({ "metadata": { "annotations": { EGRESS_SUBNETS_ANNOTATION: text } } });
    let written = match &settings.subnets_on {
        SubnetsOn::Node => {
            let api: Api<Node> = Api::all(client.clone());
            api.patch(&settings.node, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
        }
        SubnetsOn::Pod(namespace, name) => {
            let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
        }
    };
    match written {
        Ok(_) => {
            tracing::info!(subnets = %text, "published this node's egress subnets");
            st.published = Some((subnets, Instant::now()));
        }
        Err(e) => tracing::warn!(error = %e, "node egress subnets not published; will retry"),
    }
}

/// An EgressIP whose items are to be written: its request, the planned items, their set.
type Pending = (Request, Vec<(IpAddr, String)>, BTreeSet<(IpAddr, String)>);

/// Plan, write the items that differ, record the Events.
async fn place(
    client: &Client,
    settings: &PlacementSettings,
    leadership: &Leadership,
    snap: &Snapshot,
    st: &mut State,
) {
    let candidates: BTreeMap<String, Candidate> = snap
        .nodes
        .iter()
        .map(|(n, info)| {
            let reach = st.probed.get(n).map_or(Reach::Unknown, |p| p.reach);
            (n.clone(), Candidate::new(info, reach))
        })
        .collect();
    let requests: Vec<Request> = snap
        .egress_ips
        .iter()
        .map(|(name, p, _)| Request { name: name.clone(), ips: p.ips.clone(), items: p.placement.clone() })
        .collect();
    let configs = cloud::by_ip(&snap.cloud_ips);
    let mut placement = if settings.mode.cloud() {
        // The configs' requests count as placements while the cloud works on them.
        let planned: Vec<Request> = requests
            .iter()
            .map(|r| Request { items: cloud::pending_items(&r.name, &r.ips, &r.items, &configs), ..r.clone() })
            .collect();
        plan_with(&planned, &candidates, &st.held)
    } else {
        plan_with(&requests, &candidates, &st.held)
    };
    if settings.mode.cloud() {
        cloud_leader(client, settings, leadership, snap, st, &placement.items, &configs).await;
        for items in placement.items.values_mut() {
            *items = cloud::published(items, &configs);
        }
    }
    let todo = pending(snap, &requests, &placement, st);
    if !leadership.is_leader() {
        return;
    }
    write_placements(client, leadership, todo, st).await;
    record_events(client, settings, leadership, placement.events, st).await;
}

/// The EgressIPs whose `status.items` differ from the plan and were not just written:
/// (the request, its planned items, their set).
fn pending(snap: &Snapshot, requests: &[Request], placement: &Placement, st: &mut State) -> Vec<Pending> {
    let rejected: BTreeSet<&str> = snap.egress_ips.iter().filter(|e| e.2).map(|e| e.0.as_str()).collect();
    let now = Instant::now();
    st.written.retain(|name, (items, until)| {
        let seen = requests.iter().find(|r| r.name == *name).is_none_or(|r| item_set(&r.items) == *items);
        !seen && now < *until
    });
    let mut todo = Vec::new();
    for r in requests {
        if rejected.contains(r.name.as_str()) {
            continue;
        }
        let desired = placement.items.get(&r.name).cloned().unwrap_or_default();
        let want = item_set(&desired);
        if want == item_set(&r.items) || st.written.get(&r.name).is_some_and(|(w, _)| *w == want) {
            continue;
        }
        todo.push((r.clone(), desired, want));
    }
    todo
}

/// Write the `todo` items (several at a time: a node hosting many egress IPs dies, all
/// of them move at once), each only while this node still leads.
async fn write_placements(client: &Client, leadership: &Leadership, todo: Vec<Pending>, st: &mut State) {
    let done: Vec<_> = futures::stream::iter(todo.into_iter().map(|(r, desired, want)| async move {
        // Right before each write: a leader that lost its lease writes nothing more.
        let result = if leadership.is_leader() { write_items(client, &r, &desired).await } else { Ok(false) };
        (r, desired, want, result)
    }))
    .buffer_unordered(WRITES_AT_ONCE)
    .collect()
    .await;
    for (r, desired, want, result) in done {
        let hold = match result {
            Ok(true) => {
                tracing::info!(egress_ip = %r.name, items = ?desired, "egress IP placement written");
                Duration::from_secs(5)
            }
            Ok(false) => {
                tracing::debug!(egress_ip = %r.name, "placement not written: the view is behind the object");
                Duration::from_millis(500)
            }
            Err(e) => {
                tracing::warn!(egress_ip = %r.name, error = %e, "placement not written; will retry");
                Duration::from_secs(2)
            }
        };
        st.written.insert(r.name.clone(), (want, Instant::now() + hold));
    }
}

/// Record the plan's Events, once per distinct (reason, message) while it lasts.
async fn record_events(
    client: &Client,
    settings: &PlacementSettings,
    leadership: &Leadership,
    events: Vec<PlacementEvent>,
    st: &mut State,
) {
    let mut now: BTreeMap<String, BTreeSet<(&'static str, String)>> = BTreeMap::new();
    for e in events {
        now.entry(e.name).or_default().insert((e.reason, e.message));
    }
    st.evented.retain(|name, _| now.contains_key(name));
    for (name, events) in now {
        for (reason, message) in events {
            if st.evented.get(&name).is_some_and(|s| s.contains(&(reason, message.clone()))) {
                continue;
            }
            if !leadership.is_leader() {
                return;
            }
            let key = ObjectKey::new(Kind::EgressIP, "", &name);
            // Recorded as done either way: a failing API is not retried in a hot loop
            // (the log has the message).
            match crate::status::writer::record_event(client, &settings.node, &key, reason, "Assign", &message).await {
                Ok(()) => tracing::warn!(egress_ip = %name, reason, message = %message, "placement event"),
                Err(e) => {
                    tracing::warn!(egress_ip = %name, reason, message = %message, error = %e, "event not recorded")
                }
            }
            st.evented.entry(name.clone()).or_default().insert((reason, message));
        }
    }
}

/// `cloud-local`, every node: act as the controller of the configs naming this node.
async fn cloud_node(client: &Client, settings: &PlacementSettings, snap: &Snapshot, st: &mut State) {
    let Some(hosted) = &snap.hosted else { return };
    for c in &snap.cloud_ips {
        let problem = snap.cloud_problems.get(&c.ip).map(String::as_str);
        let (status, finalizer) =
            cloud::Provider::on_node(&cloud::LocalProvider, &settings.node, c, hosted.contains(&c.ip), problem);
        act(client, c.ip, status, finalizer, &mut st.cloud_node).await;
    }
}

/// Send a config's status and finalizer change, once while the echo is on its way.
async fn act(
    client: &Client,
    ip: IpAddr,
    status: Option<cloud::ConfigStatus>,
    finalizer: Option<bool>,
    pending: &mut cloud::Pending,
) {
    if let Some(add) = finalizer
        && pending.take(cloud::key(ip, "finalizer", &json!(add)), Duration::from_secs(2))
    {
        match cloud::set_finalizer(client, ip, add).await {
            Ok(()) => tracing::info!(ip = %ip, add, "CloudPrivateIPConfig finalizer updated"),
            Err(e) => tracing::warn!(ip = %ip, error = %e, "CloudPrivateIPConfig finalizer not updated; will retry"),
        }
    }
    if let Some(s) = status {
        let k = json!([s.node, s.status, s.reason, s.message]);
        if pending.take(cloud::key(ip, "status", &k), Duration::from_secs(2)) {
            match cloud::write_status(client, ip, &s).await {
                Ok(()) => {
                    tracing::info!(ip = %ip, node = ?s.node, reason = s.reason, message = %s.message, "CloudPrivateIPConfig status written")
                }
                Err(e) => tracing::warn!(ip = %ip, error = %e, "CloudPrivateIPConfig status not written; will retry"),
            }
        }
    }
}

/// The leader, cloud modes: make the configs match the plan; in `cloud-local` stand in
/// for nodes that cannot act.
async fn cloud_leader(
    client: &Client,
    settings: &PlacementSettings,
    leadership: &Leadership,
    snap: &Snapshot,
    st: &mut State,
    planned: &BTreeMap<String, Vec<(IpAddr, String)>>,
    configs: &BTreeMap<IpAddr, CloudPrivateIp>,
) {
    let rejected: BTreeSet<&str> = snap.egress_ips.iter().filter(|e| e.2).map(|e| e.0.as_str()).collect();
    let mut want: BTreeMap<IpAddr, (String, String)> = BTreeMap::new();
    for (name, items) in planned {
        for (ip, node) in items {
            want.insert(*ip, (name.clone(), node.clone()));
        }
    }
    // A rejected EgressIP keeps its configs as they are.
    for c in configs.values() {
        if let (Some(owner), Some(node)) = (&c.owner, &c.node)
            && rejected.contains(owner.as_str())
        {
            want.entry(c.ip).or_insert((owner.clone(), node.clone()));
        }
    }
    for change in cloud::config_changes(&want, configs) {
        if !leadership.is_leader() {
            return;
        }
        if !st.cloud_leader.take(format!("{change:?}"), Duration::from_secs(2)) {
            continue;
        }
        match cloud::apply_change(client, &change).await {
            Ok(()) => tracing::info!(change = ?change, "CloudPrivateIPConfig changed"),
            Err(e) => tracing::warn!(change = ?change, error = %e, "CloudPrivateIPConfig not changed; will retry"),
        }
    }
    if settings.mode != EgressIpMode::CloudLocal {
        return;
    }
    let reach: BTreeMap<String, Reach> = st.probed.iter().map(|(n, p)| (n.clone(), p.reach)).collect();
    for c in configs.values() {
        let node_ok = |n: &str| cloud::node_ok(&snap.nodes, &reach, n);
        let (status, finalizer) = cloud::Provider::on_leader(&cloud::LocalProvider, c, &node_ok);
        if (status.is_some() || finalizer.is_some()) && leadership.is_leader() {
            act(client, c.ip, status, finalizer, &mut st.cloud_leader).await;
        }
    }
}

/// Write `items` as `status.items` of `r`: `Ok(false)` when the stored object is not what
/// the plan was made from (its spec or items changed since; the watch will tell) or was
/// changed in between (409).
async fn write_items(client: &Client, r: &Request, items: &[(IpAddr, String)]) -> Result<bool, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &Kind::EgressIP.api_resource());
    let Some(mut obj) = api.get_opt(&r.name).await? else { return Ok(false) };
    let stored_ips: BTreeSet<IpAddr> = obj.data["spec"]["egressIPs"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default();
    let stored_items: BTreeSet<(IpAddr, String)> = obj.data["status"]["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| Some((v["egressIP"].as_str()?.parse().ok()?, v["node"].as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    if stored_ips != r.ips.iter().copied().collect() || stored_items != item_set(&r.items) {
        return Ok(false);
    }
    let list: Vec<serde_json::Value> =
        items.iter().map(|(ip, node)| json!({ "egressIP": ip.to_string(), "node": node })).collect();
    if !obj.data["status"].is_object() {
        obj.data["status"] = json!({});
    }
    obj.data["status"]["items"] = json!(list);
    match api.replace(&r.name, &PostParams::default(), &obj).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::HostLink;

    #[test]
    fn published_subnets_leave_out_host_routes_link_local_and_pod_networks() {
        let link = |up: bool, addrs: &[&str]| HostLink {
            index: 1,
            name: "x".into(),
            up,
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            gateways: vec![],
        };
        let links = HostLinks {
            links: vec![
                link(true, &["198.19.0.1/24", "2001:db8:0:1::1/64", "fe80::1/64", "203.0.113.5/32"]),
                link(true, &["198.18.1.1/30"]),
                link(false, &["198.51.100.2/24"]),
                link(true, &["127.0.0.1/8"]),
            ],
            ..Default::default()
        };
        let got = hosting_subnets(&links, &["198.18.0.0/16".parse().unwrap()]);
        let want: Vec<IpNet> = vec!["198.19.0.0/24".parse().unwrap(), "2001:db8:0:1::/64".parse().unwrap()];
        assert_eq!(got, want);
    }
}
