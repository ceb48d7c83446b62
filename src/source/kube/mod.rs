//! The Kubernetes source: watches of the four custom resources, Nodes, Namespaces and
//! Pods (kube-runtime watchers with the default backoff), feeding the same
//! [`ClusterView`] as the manifests source.
//!
//! Guarantees:
//! * [`KubeObjects::wait_synced`] returns once every kind has been listed completely: the
//!   agent applies nothing before that.
//! * Custom resources are watched as dynamic objects and run through the same parser as
//!   manifests ([`crate::api::parse_document`]), so a malformed object is reported (its
//!   last good version kept) and never stops the watch.
//! * A re-list (after a 410 Gone, an API server restart or an outage) replaces that kind's
//!   objects: what was deleted meanwhile disappears at the end of the re-list. While the
//!   API is unreachable the view, and so the dataplane, stays as it is.
//! * Pods are reduced to the fields egressd uses as they arrive.
//! * An agent follows only its own node's pods (field selector `spec.nodeName=<node>`),
//!   unless the node hosts an egress IP, or may be given one, while an EgressIP exists
//!   ([`ClusterView::needs_cluster_pods`]): then every scheduled pod (`spec.nodeName!=`), because the
//!   SNAT of pods steered to it over a shared link names them by address. A change of
//!   scope is a new watch whose list replaces the pods (as a re-list does); messages of
//!   the watch it replaced are dropped by their generation, so none arrives late.
//!
//! The observed `status` of EgressFirewall and EgressQoS objects is kept too, so the status
//! writer only writes what differs from what the API already has.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, DynamicObject, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::api::parse::Parsed;
use crate::api::{Kind, Object, ObjectKey, parse_document};
use crate::status::board::StatusBoard;
use crate::view::ClusterView;
use crate::view::observed::{Observed, observe};

mod watches;
use watches::*;
pub use watches::{NARROW_AFTER, PodScope};

/// What a watcher reports.
#[derive(Debug)]
pub(crate) enum KubeMsg {
    /// A (re-)list of `kind` starts.
    Init(Kind),
    /// An object was added or changed (or listed, during a re-list).
    Apply {
        /// The object's kind and name.
        key: ObjectKey,
        /// The decoded object, or why it was rejected.
        object: Result<Box<Object>, String>,
        /// Its `uid` and `status` as stored, for the status writer (custom kinds).
        observed: Option<Observed>,
    },
    /// An object was deleted.
    Delete(ObjectKey),
    /// The (re-)list of `kind` is complete.
    InitDone(Kind),
    /// The watch failed (it retries with backoff).
    Error(Kind, WatchProblem, String),
}

impl KubeMsg {
    /// The `event` label of `egressd_watch_events`, `listing` while its kind's list
    /// runs (none for what is not an object or list from the API server: the end of a
    /// list, an error).
    fn event(&self, listing: bool) -> Option<&'static str> {
        match self {
            Self::Init(_) => Some("relist"),
            Self::Apply { .. } if listing => Some("listed"),
            Self::Apply { .. } => Some("apply"),
            Self::Delete(_) => Some("delete"),
            Self::InitDone(_) | Self::Error(..) => None,
        }
    }

    /// The kind the message is about.
    fn kind(&self) -> Kind {
        match self {
            Self::Init(k) | Self::InitDone(k) | Self::Error(k, ..) => *k,
            Self::Apply { key, .. } | Self::Delete(key) => key.kind,
        }
    }
}

/// Why a watch failed, as far as it matters to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchProblem {
    /// 404: the kind is not served (its CRD is not installed). A kind never listed is
    /// empty; one listed before keeps what it had until it can be listed again.
    Missing,
    /// 403: RBAC does not allow listing it: as [`WatchProblem::Missing`], and an error.
    Forbidden,
    /// Anything else (the API server unreachable, a timeout): retried, nothing changes.
    Other,
}

impl WatchProblem {
    fn of(e: &watcher::Error) -> Self {
        let code = match e {
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
            watcher::Error::WatchError(s) => s.code,
            _ => 0,
        };
        match code {
            404 => Self::Missing,
            403 => Self::Forbidden,
            _ => Self::Other,
        }
    }
}

/// The kinds watched.
pub(crate) const KINDS: [Kind; 7] = [
    Kind::Namespace,
    Kind::Node,
    Kind::Pod,
    Kind::EgressFirewall,
    Kind::EgressQoS,
    Kind::EgressIP,
    Kind::CloudPrivateIPConfig,
];

/// Why no Kubernetes client could be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file cannot be read or used.
    #[error("{path}: {source}")]
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Not in a pod (or its service account is missing).
    #[error("in-cluster configuration: {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// The configuration cannot make a client (TLS set-up, say).
    #[error("cannot create the client: {0}")]
    Client(#[source] kube::Error),
}

/// A client from a kubeconfig file, or the in-cluster configuration when `None`.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |source| ClientError::Kubeconfig { path: path.to_path_buf(), source };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.map_err(err)?
        }
        None => kube::Config::incluster().map_err(ClientError::InCluster)?,
    };
    Client::try_from(config).map_err(ClientError::Client)
}

/// The view built from the watches.
#[derive(Debug, Default)]
pub(crate) struct KubeObjects {
    view: ClusterView,
    /// Keys seen during a running re-list, per kind.
    relisting: BTreeMap<Kind, BTreeSet<ObjectKey>>,
    /// Every key currently in the view, per kind.
    present: BTreeMap<Kind, BTreeSet<ObjectKey>>,
    /// Kinds listed completely at least once.
    synced: BTreeSet<Kind>,
    /// Current watch errors by kind.
    errors: BTreeMap<Kind, String>,
    /// Objects rejected by the parser, with the reason.
    rejected: BTreeMap<ObjectKey, String>,
    /// Stored uids and statuses (not part of the view: never a reason to recompile).
    board: StatusBoard,
    /// Kinds that cannot be listed (CRD missing, or forbidden), with the error: empty.
    unavailable: BTreeMap<Kind, (WatchProblem, String)>,
}

/// The Kubernetes watches as a [`super::ViewSource`].
pub struct KubeWatch {
    source: KubeObjects,
    rx: mpsc::Receiver<Tagged>,
    pods: PodWatch,
    telemetry: std::sync::Arc<crate::telemetry::Telemetry>,
    reported: BTreeMap<Kind, WatchProblem>,
    /// When the first message of the last reported change arrived.
    seen: Option<std::time::Instant>,
}

impl KubeWatch {
    /// The stored uids and statuses (for the status writer).
    pub fn status_board(&self) -> StatusBoard {
        self.source.status_board()
    }

    /// Readiness and the `kind_unavailable` metric follow the unavailable kinds.
    fn report_kinds(&mut self) {
        use crate::telemetry::metrics::KindLabels;
        let now: BTreeMap<Kind, WatchProblem> = self.source.unavailable().iter().map(|(k, (p, _))| (*k, *p)).collect();
        if now == self.reported {
            return;
        }
        let label = |p: WatchProblem| if p == WatchProblem::Forbidden { "forbidden" } else { "missing" };
        for (kind, p) in &self.reported {
            let labels = KindLabels { kind: kind.to_string(), reason: label(*p).into() };
            self.telemetry.metrics.kind_unavailable.get_or_create(&labels).set(0);
        }
        for (kind, p) in &now {
            let labels = KindLabels { kind: kind.to_string(), reason: label(*p).into() };
            self.telemetry.metrics.kind_unavailable.get_or_create(&labels).set(1);
        }
        self.telemetry.health.set_unavailable_kinds(
            now.iter()
                .map(|(k, p)| crate::telemetry::UnavailableKind {
                    kind: k.to_string(),
                    blocking: *p == WatchProblem::Forbidden,
                    reason: unavailable_text(*p).into(),
                })
                .collect(),
        );
        self.reported = now;
    }

    /// Start the watches and wait until every kind is listed (the agent applies nothing
    /// before that), pods in the scope the node needs. Logs progress while the API server
    /// is unreachable.
    pub async fn start(
        client: &Client,
        scope: PodScope,
        telemetry: std::sync::Arc<crate::telemetry::Telemetry>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        start_watches(client, &tx);
        let node = match scope {
            PodScope::Cluster => None,
            PodScope::Node(n) => Some(n),
        };
        let mut pods = PodWatch {
            node,
            wide: false,
            generation: 0,
            listed: false,
            task: None,
            start: Some((client.clone(), tx)),
            hold: NARROW_AFTER,
            narrow_at: None,
        };
        pods.restart(pods.node.is_none());
        let mut view = Self { source: KubeObjects::new(), rx, pods, telemetry, reported: BTreeMap::new(), seen: None };
        loop {
            if view.source.synced() {
                // The node's scope is known once EgressIPs and Nodes are listed; a node
                // that needs every pod waits for their list too.
                view.rescope();
                if view.pods.listed || view.source.unavailable().contains_key(&Kind::Pod) {
                    break;
                }
            }
            match view.rx.recv().await {
                Some((generation, msg)) => {
                    view.take(generation, msg);
                }
                None => break,
            }
        }
        view.report_kinds();
        tracing::info!(
            pods = view.source.view().pods.len(),
            cluster_pods = view.pods.wide,
            nodes = view.source.view().nodes.len(),
            "initial lists complete"
        );
        view
    }

    /// Count a watch's message (`egressd_watch_events`) and hand it to the view unless
    /// it comes from a pod watch since replaced. Whether the view changed.
    fn take(&mut self, generation: u64, msg: KubeMsg) -> bool {
        if let Some(event) = msg.event(self.source.relisting.contains_key(&msg.kind())) {
            let labels = crate::telemetry::metrics::WatchEventLabels { kind: msg.kind().to_string(), event };
            self.telemetry.metrics.watch_events.get_or_create(&labels).inc();
        }
        self.pods.current(generation, &msg) && self.source.handle(msg)
    }

    /// Whether the pod watch covers every pod of the cluster.
    pub fn follows_cluster_pods(&self) -> bool {
        self.pods.wide
    }

    /// Replace the pod watch when the node's need for other nodes' pods changed: wider
    /// at once, narrower once the need has been gone for [`PodWatch::hold`] (the view
    /// holds more pods than the node needs meanwhile, which changes nothing it compiles:
    /// `tests/incremental.rs`).
    fn rescope(&mut self) {
        let Some(node) = &self.pods.node else { return };
        let wide = self.source.view().needs_cluster_pods(node);
        let now = tokio::time::Instant::now();
        if wide || !self.pods.wide {
            self.pods.narrow_at = None;
            if wide && !self.pods.wide {
                self.pods.restart(true);
            }
            return;
        }
        let due = *self.pods.narrow_at.get_or_insert(now + self.pods.hold);
        if now >= due {
            tracing::info!(after = ?self.pods.hold, "no egress IP to host or take over: back to this node's pods");
            self.pods.narrow_at = None;
            self.pods.restart(false);
        }
    }
}

impl super::ViewSource for KubeWatch {
    fn view(&self) -> &ClusterView {
        self.source.view()
    }

    fn view_mut(&mut self) -> &mut ClusterView {
        &mut self.source.view
    }

    fn problems(&self) -> Vec<String> {
        self.source.problems()
    }

    /// Cancellation-safe: `recv` is, and nothing is awaited once a message is taken (a
    /// message handled is always reported by the same call).
    async fn next_change(&mut self) -> bool {
        let received = match self.pods.narrow_at {
            Some(at) => tokio::select! {
                m = self.rx.recv() => m,
                _ = tokio::time::sleep_until(at) => {
                    // Narrowing changes nothing yet: the new watch's list does.
                    self.rescope();
                    return false;
                }
            },
            None => self.rx.recv().await,
        };
        let Some((generation, first)) = received else {
            return std::future::pending().await;
        };
        self.seen = Some(std::time::Instant::now());
        let mut changed = self.take(generation, first);
        // Coalesce what is queued already (a re-list, a rollout arrive as a burst) into
        // one recompile, without waiting for more: what arrives during that recompile
        // and sync is queued, and coalesced at the next call.
        while let Ok((generation, msg)) = self.rx.try_recv() {
            changed |= self.take(generation, msg);
        }
        if changed {
            self.rescope();
        }
        self.report_kinds();
        changed
    }

    fn seen_at(&self) -> Option<std::time::Instant> {
        self.seen
    }
}

impl KubeObjects {
    /// An empty source.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The view.
    pub(crate) fn view(&self) -> &ClusterView {
        &self.view
    }

    /// Whether every kind has been listed completely, or cannot be listed at all (then
    /// it counts as empty; the watch keeps retrying and picks it up when it appears).
    pub(crate) fn synced(&self) -> bool {
        KINDS.iter().all(|k| self.synced.contains(k) || self.unavailable.contains_key(k))
    }

    /// Kinds that cannot be listed, with why.
    pub(crate) fn unavailable(&self) -> &BTreeMap<Kind, (WatchProblem, String)> {
        &self.unavailable
    }

    /// `kind` can be listed again.
    fn available(&mut self, kind: Kind) {
        if self.unavailable.remove(&kind).is_some() {
            tracing::info!(kind = %kind, "kind can be listed again; following it");
        }
    }

    /// The stored uids and statuses, for the status writer.
    pub(crate) fn status_board(&self) -> StatusBoard {
        self.board.clone()
    }

    /// Watch errors and rejected objects, for the status file.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self.errors.iter().map(|(k, e)| format!("watch {k}: {e}")).collect();
        out.extend(self.unavailable.iter().map(|(k, (p, e))| format!("watch {k}: {}: {e}", unavailable_text(*p))));
        out.extend(self.rejected.iter().map(|(k, e)| format!("{k}: {e}")));
        out
    }

    /// Apply one message. Returns whether the view changed (a change of a stored status
    /// alone goes to the [`StatusBoard`] and is not a view change).
    pub(crate) fn handle(&mut self, msg: KubeMsg) -> bool {
        match msg {
            KubeMsg::Init(kind) => {
                self.relisting.insert(kind, BTreeSet::new());
                false
            }
            KubeMsg::Apply { key, object, observed } => self.applied(key, object, observed),
            KubeMsg::Delete(key) => {
                self.remove(&key);
                true
            }
            KubeMsg::InitDone(kind) => self.listed(kind),
            KubeMsg::Error(kind, problem @ (WatchProblem::Missing | WatchProblem::Forbidden), e) => {
                self.unavailable_kind(kind, problem, e)
            }
            KubeMsg::Error(kind, WatchProblem::Other, e) => {
                // Each different error is logged once (a 410 after connection errors
                // must show); repeats of the same one only at debug level.
                if self.errors.insert(kind, e.clone()).as_deref() != Some(e.as_str()) {
                    tracing::warn!(kind = %kind, error = %e, "watch failed; retrying, dataplane unchanged");
                } else {
                    tracing::debug!(kind = %kind, error = %e, "watch failed again");
                }
                false
            }
        }
    }

    /// An object was added, changed or listed.
    fn applied(&mut self, key: ObjectKey, object: Result<Box<Object>, String>, observed: Option<Observed>) -> bool {
        self.errors.remove(&key.kind);
        self.available(key.kind);
        if let Some(seen) = self.relisting.get_mut(&key.kind) {
            seen.insert(key.clone());
        }
        self.present.entry(key.kind).or_default().insert(key.clone());
        if let Some(o) = observed {
            self.board.set(&key, o);
        }
        match object {
            Ok(o) => {
                self.rejected.remove(&key);
                self.view.upsert(&o)
            }
            Err(e) => {
                tracing::warn!(object = %key, error = %e, "object rejected");
                self.rejected.insert(key.clone(), e.clone());
                self.view.reject(&key, e)
            }
        }
    }

    /// The (re-)list of `kind` is complete: what it did not list is gone.
    fn listed(&mut self, kind: Kind) -> bool {
        self.errors.remove(&kind);
        self.available(kind);
        let seen = self.relisting.remove(&kind).unwrap_or_default();
        let gone: Vec<ObjectKey> =
            self.present.get(&kind).map(|p| p.difference(&seen).cloned().collect()).unwrap_or_default();
        for key in &gone {
            self.remove(key);
        }
        let first = self.synced.insert(kind);
        tracing::debug!(kind = %kind, listed = seen.len(), removed = gone.len(), "list complete");
        first || !gone.is_empty()
    }

    /// `kind` is not served or forbidden.
    fn unavailable_kind(&mut self, kind: Kind, problem: WatchProblem, e: String) -> bool {
        self.relisting.remove(&kind);
        let first = self.unavailable.insert(kind, (problem, e.clone())).is_none_or(|(p, _)| p != problem);
        if first {
            match problem {
                WatchProblem::Missing => tracing::warn!(
                    kind = %kind, error = %e,
                    "kind not served (CRD not installed?): treated as empty, re-checked with backoff"
                ),
                _ => tracing::error!(
                    kind = %kind, error = %e,
                    "listing this kind is forbidden: treated as empty; grant get/list/watch (daemonset/rbac.yaml)"
                ),
            }
        }
        // A kind listed before keeps its objects: a restarting API server
        // answers 403 and 404 until its RBAC and CRD caches are filled, and that
        // must not empty the view (found by 60 s without the API server). A CRD
        // that is really deleted takes its objects first, each a Delete event;
        // the next successful list reconciles the rest.
        if self.synced.contains(&kind) {
            return false;
        }
        first
    }

    fn remove(&mut self, key: &ObjectKey) {
        self.view.remove(key);
        self.board.remove(key);
        self.rejected.remove(key);
        if let Some(p) = self.present.get_mut(&key.kind) {
            p.remove(key);
        }
    }
}

/// How an unavailable kind is described (status file, log, readiness).
pub(crate) fn unavailable_text(p: WatchProblem) -> &'static str {
    match p {
        WatchProblem::Missing => "not served (CRD not installed?), treated as empty",
        WatchProblem::Forbidden => "forbidden by RBAC, treated as empty",
        WatchProblem::Other => "failing",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(name: &str) -> KubeMsg {
        let mut n = Namespace::default();
        n.metadata.name = Some(name.into());
        KubeMsg::Apply {
            key: ObjectKey::new(Kind::Namespace, "", name),
            object: Ok(Box::new(Object::Namespace(n))),
            observed: None,
        }
    }

    #[test]
    fn synced_only_after_every_kind_listed() {
        let mut s = KubeObjects::new();
        for k in KINDS {
            assert!(!s.synced());
            s.handle(KubeMsg::Init(k));
            s.handle(KubeMsg::InitDone(k));
        }
        assert!(s.synced());
    }

    #[test]
    fn kinds_that_cannot_be_listed_count_as_empty_until_they_can() {
        let mut s = KubeObjects::new();
        for k in KINDS.iter().filter(|k| !matches!(k, Kind::CloudPrivateIPConfig | Kind::EgressQoS)) {
            s.handle(KubeMsg::Init(*k));
            s.handle(KubeMsg::InitDone(*k));
        }
        assert!(!s.synced());
        let other = KubeMsg::Error(Kind::EgressQoS, WatchProblem::Other, "connection refused".into());
        assert!(!s.handle(other));
        assert!(!s.synced(), "an unreachable server is not an empty kind");
        assert!(s.handle(KubeMsg::Error(Kind::CloudPrivateIPConfig, WatchProblem::Missing, "404".into())));
        assert!(s.handle(KubeMsg::Error(Kind::EgressQoS, WatchProblem::Forbidden, "403".into())));
        assert!(s.synced(), "missing and forbidden kinds do not block the first sync");
        assert!(!s.handle(KubeMsg::Error(Kind::CloudPrivateIPConfig, WatchProblem::Missing, "404".into())));
        assert_eq!(s.unavailable().len(), 2);
        assert!(s.problems().iter().any(|p| p.contains("EgressQoS") && p.contains("forbidden")));
        // The CRD appears: listed, followed.
        s.handle(KubeMsg::Init(Kind::CloudPrivateIPConfig));
        assert!(s.handle(KubeMsg::InitDone(Kind::CloudPrivateIPConfig)));
        assert_eq!(s.unavailable().len(), 1);
        // A kind listed before keeps its objects when a (restarting) API server answers
        // 403 or 404 for it; it is reported unavailable until the next list, which
        // reconciles.
        s.handle(KubeMsg::Init(Kind::Namespace));
        s.handle(ns("a"));
        s.handle(ns("b"));
        s.handle(KubeMsg::InitDone(Kind::Namespace));
        assert!(!s.handle(KubeMsg::Error(Kind::Namespace, WatchProblem::Forbidden, "403".into())));
        assert!(!s.handle(KubeMsg::Error(Kind::Namespace, WatchProblem::Missing, "404".into())));
        assert_eq!(s.view().namespaces.len(), 2, "a transient 403/404 emptied a listed kind");
        assert!(s.unavailable().contains_key(&Kind::Namespace));
        s.handle(KubeMsg::Init(Kind::Namespace));
        s.handle(ns("a"));
        assert!(s.handle(KubeMsg::InitDone(Kind::Namespace)), "the re-list removes what went away");
        assert_eq!(s.view().namespaces.len(), 1);
        assert!(!s.unavailable().contains_key(&Kind::Namespace));
    }

    /// A watch fed by `rx`, its pod watch (of `node`'s pods, or every pod) at
    /// `generation` and never started.
    fn test_watch(rx: mpsc::Receiver<Tagged>, node: Option<&str>, generation: u64) -> KubeWatch {
        KubeWatch {
            source: KubeObjects::new(),
            rx,
            pods: PodWatch {
                node: node.map(String::from),
                wide: node.is_none(),
                generation,
                listed: false,
                task: None,
                start: None,
                hold: std::time::Duration::ZERO,
                narrow_at: None,
            },
            telemetry: std::sync::Arc::new(crate::telemetry::Telemetry::default()),
            reported: BTreeMap::new(),
            seen: None,
        }
    }

    /// A change is reported when it arrives, with every message queued behind it in
    /// the same report; a call with nothing queued waits, and dropping it (the agent's
    /// loop `select!`s `next_change` against timers) loses nothing: there is no await
    /// between handling a message and reporting it.
    #[tokio::test]
    async fn queued_messages_coalesce_and_a_dropped_wait_loses_nothing() {
        use super::super::ViewSource;
        let (tx, rx) = mpsc::channel(16);
        let mut w = test_watch(rx, None, 0);
        tx.send((0, KubeMsg::Init(Kind::Namespace))).await.unwrap();
        tx.send((0, ns("a"))).await.unwrap();
        tx.send((0, ns("b"))).await.unwrap();
        tx.send((0, KubeMsg::InitDone(Kind::Namespace))).await.unwrap();
        let first = tokio::time::timeout(std::time::Duration::from_secs(1), w.next_change()).await;
        assert_eq!(first, Ok(true));
        assert_eq!(w.view().namespaces.len(), 2, "the queued messages are in the same report");
        let seen = w.seen_at().expect("seen");
        let idle = tokio::time::timeout(std::time::Duration::from_millis(20), w.next_change()).await;
        assert!(idle.is_err(), "reported a change while nothing arrived");
        tx.send((0, KubeMsg::Delete(ObjectKey::new(Kind::Namespace, "", "a")))).await.unwrap();
        let again = tokio::time::timeout(std::time::Duration::from_secs(1), w.next_change()).await;
        assert_eq!(again, Ok(true), "the change after a dropped wait was lost");
        assert_eq!(w.view().namespaces.keys().collect::<Vec<_>>(), vec!["b"]);
        assert!(w.seen_at().is_some_and(|s| s > seen), "seen_at is the new change's arrival");
    }

    fn pod(name: &str, node: &str, ip: &str) -> KubeMsg {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "a"},
            "spec": {"nodeName": node, "containers": []},
            "status": {"podIP": ip, "phase": "Running"}
        }))
        .unwrap();
        KubeMsg::Apply {
            key: ObjectKey::new(Kind::Pod, "a", name),
            object: Ok(Box::new(Object::Pod(p))),
            observed: None,
        }
    }

    fn egress_ip(host: Option<&str>) -> KubeMsg {
        let items: Vec<_> = host.iter().map(|h| serde_json::json!({"node": h, "egressIP": "192.0.2.50"})).collect();
        let o: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "k8s.ovn.org/v1", "kind": "EgressIP",
            "metadata": {"name": "e1", "uid": "u1"},
            "spec": {"egressIPs": ["192.0.2.50"], "namespaceSelector": {"matchLabels": {"t": "a"}}},
            "status": {"items": items}
        }))
        .unwrap();
        custom(Kind::EgressIP, o)
    }

    fn node_msg(name: &str, assignable: bool) -> KubeMsg {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        if assignable {
            n.metadata.labels = Some([(crate::view::EGRESS_ASSIGNABLE_LABEL.to_string(), String::new())].into());
        }
        KubeMsg::Apply {
            key: ObjectKey::new(Kind::Node, "", name),
            object: Ok(Box::new(Object::Node(n))),
            observed: None,
        }
    }

    fn pod_names(view: &ClusterView) -> Vec<&str> {
        view.pods.keys().map(|(_, n)| n.as_str()).collect()
    }

    #[test]
    fn only_a_node_that_hosts_or_may_host_an_egress_ip_needs_other_nodes_pods() {
        let mut s = KubeObjects::new();
        s.handle(node_msg("a", true));
        s.handle(node_msg("b", false));
        s.handle(node_msg("c", false));
        for n in ["a", "b", "c"] {
            assert!(!s.view().needs_cluster_pods(n), "{n}: no EgressIP, no need");
        }
        s.handle(egress_ip(None));
        assert!(s.view().needs_cluster_pods("a"), "assignable, an EgressIP exists: ready for a failover");
        assert!(!s.view().needs_cluster_pods("b"));
        s.handle(egress_ip(Some("b")));
        assert!(s.view().needs_cluster_pods("b"), "hosts the egress IP");
        assert!(!s.view().needs_cluster_pods("c"));
    }

    /// The pod watch follows the node's need; the list of a new scope replaces the pods,
    /// and a message of a replaced watch that arrives late changes nothing.
    #[tokio::test]
    async fn the_pod_scope_follows_hosting_and_a_replaced_watch_is_ignored() {
        use super::super::ViewSource;
        let (tx, rx) = mpsc::channel(64);
        let mut w = test_watch(rx, Some("a"), 1);
        async fn next(w: &mut KubeWatch) {
            let f = w.next_change();
            tokio::time::timeout(std::time::Duration::from_secs(1), f).await.expect("a change");
        }
        for m in [KubeMsg::Init(Kind::Pod), pod("local", "a", "198.18.1.2"), KubeMsg::InitDone(Kind::Pod)] {
            tx.send((1, m)).await.unwrap();
        }
        next(&mut w).await;
        assert_eq!(pod_names(w.view()), ["local"]);
        assert!(!w.follows_cluster_pods());
        // This node becomes the host: a new watch (generation 2) of every pod.
        tx.send((0, egress_ip(Some("a")))).await.unwrap();
        next(&mut w).await;
        assert!(w.follows_cluster_pods());
        assert_eq!(w.pods.generation, 2);
        for m in [KubeMsg::Init(Kind::Pod), pod("local", "a", "198.18.1.2"), pod("remote", "b", "198.18.2.2")] {
            tx.send((2, m)).await.unwrap();
        }
        tx.send((1, pod("late", "a", "198.18.1.9"))).await.unwrap();
        tx.send((2, KubeMsg::InitDone(Kind::Pod))).await.unwrap();
        next(&mut w).await;
        assert_eq!(pod_names(w.view()), ["local", "remote"], "a message of the replaced watch was taken");
        // Not the host any more: back to the node's own pods; the list removes the rest.
        tx.send((0, egress_ip(None))).await.unwrap();
        next(&mut w).await;
        assert!(!w.follows_cluster_pods());
        tx.send((2, pod("stale", "b", "198.18.2.9"))).await.unwrap();
        for m in [KubeMsg::Init(Kind::Pod), pod("local", "a", "198.18.1.2"), KubeMsg::InitDone(Kind::Pod)] {
            tx.send((3, m)).await.unwrap();
        }
        next(&mut w).await;
        assert_eq!(pod_names(w.view()), ["local"], "other nodes' pods kept after the scope narrowed");
    }

    /// A node's own pods come from the watch cache: `resourceVersion=0` and no page
    /// limit (with a limit kube-core leaves the version out, and the list goes to etcd).
    #[test]
    fn a_nodes_own_pods_are_listed_from_the_watch_cache_and_every_pod_in_pages() {
        let own = pod_config(Some("a"));
        assert_eq!(own.list_semantic, watcher::ListSemantic::Any);
        assert_eq!(own.page_size, None);
        assert_eq!(own.field_selector.as_deref(), Some("spec.nodeName=a"));
        let every = pod_config(None);
        assert_eq!(every.list_semantic, watcher::ListSemantic::MostRecent);
        assert!(every.page_size.is_some());
    }

    /// The wide watch is kept for the hold after the node stops needing it (an EgressIP
    /// created again within it costs no re-list of the cluster), then narrows by itself,
    /// with no message to wake it.
    #[tokio::test]
    async fn the_wide_watch_narrows_only_after_the_hold() {
        use super::super::ViewSource;
        use std::time::Duration;
        let (tx, rx) = mpsc::channel(64);
        let mut w = test_watch(rx, Some("a"), 1);
        w.pods.hold = Duration::from_millis(300);
        async fn next(w: &mut KubeWatch) -> bool {
            let f = w.next_change();
            tokio::time::timeout(Duration::from_secs(2), f).await.expect("a change or the hold's end")
        }
        tx.send((0, egress_ip(Some("a")))).await.unwrap();
        next(&mut w).await;
        assert!(w.follows_cluster_pods());
        assert_eq!(w.pods.generation, 2);
        // Not the host any more, and then the host again within the hold: one watch.
        tx.send((0, egress_ip(None))).await.unwrap();
        assert!(next(&mut w).await);
        assert!(w.follows_cluster_pods(), "narrowed before the hold");
        tx.send((0, egress_ip(Some("a")))).await.unwrap();
        next(&mut w).await;
        assert_eq!((w.follows_cluster_pods(), w.pods.generation), (true, 2), "the watch was replaced");
        // Not the host: after the hold, with nothing received, back to the node's pods.
        tx.send((0, egress_ip(None))).await.unwrap();
        next(&mut w).await;
        let started = std::time::Instant::now();
        assert!(!next(&mut w).await, "the hold's end is not a view change");
        assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
        assert!(!w.follows_cluster_pods());
        assert_eq!(w.pods.generation, 3);
    }

    #[test]
    fn a_relist_removes_what_was_deleted_while_away() {
        let mut s = KubeObjects::new();
        s.handle(KubeMsg::Init(Kind::Namespace));
        s.handle(ns("a"));
        s.handle(ns("b"));
        s.handle(KubeMsg::InitDone(Kind::Namespace));
        assert_eq!(s.view().namespaces.len(), 2);
        // 410 Gone → re-list: only "a" is still there.
        s.handle(KubeMsg::Init(Kind::Namespace));
        s.handle(ns("a"));
        assert_eq!(s.view().namespaces.len(), 2, "nothing removed before the re-list completes");
        assert!(s.handle(KubeMsg::InitDone(Kind::Namespace)));
        assert_eq!(s.view().namespaces.keys().collect::<Vec<_>>(), vec!["a"]);
    }

    #[test]
    fn malformed_custom_resources_are_reported_and_keep_their_last_good_version() {
        let mut s = KubeObjects::new();
        let good: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
            "metadata": {"name": "default", "namespace": "a", "resourceVersion": "7", "uid": "x", "managedFields": []},
            "spec": {"egress": [{"type": "Deny", "to": {"cidrSelector": "192.0.2.0/24"}}]},
            "status": {"messages": ["n1: EgressFirewall Rules applied"]}
        }))
        .unwrap();
        assert!(s.handle(custom(Kind::EgressFirewall, good.clone())));
        assert!(s.view().firewalls["a"].policy.is_some());
        let key = ObjectKey::new(Kind::EgressFirewall, "a", "default");
        assert_eq!(s.status_board().snapshot()[&key].uid.as_deref(), Some("x"));
        // Another node's status write comes back as a new version with the same spec:
        // the board sees it, the view does not change (no recompile).
        let mut echo = good.clone();
        echo.data["status"] = serde_json::json!({"status": "EgressFirewall Rules applied",
            "messages": ["n1: EgressFirewall Rules applied", "n2: EgressFirewall Rules applied"]});
        echo.metadata.managed_fields = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
            manager: Some("egressd-leader".into()),
            operation: Some("Apply".into()),
            fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(serde_json::json!({"f:status": {
                "f:status": {}, "f:messages": {"v:\"n1: EgressFirewall Rules applied\"": {},
                "v:\"n2: EgressFirewall Rules applied\"": {}}}}))),
            ..Default::default()
        }]);
        assert!(!s.handle(custom(Kind::EgressFirewall, echo)), "a status echo is not a view change");
        let seen = &s.status_board().snapshot()[&key];
        assert_eq!(seen.text.as_deref(), Some("EgressFirewall Rules applied"));
        assert_eq!(seen.held["egressd-leader"].count, 2, "{seen:?}");
        let mut bad = good;
        bad.data["spec"]["egress"][0]["to"]["cidrSelector"] = serde_json::json!("1.2.3./32");
        s.handle(custom(Kind::EgressFirewall, bad));
        let entry = &s.view().firewalls["a"];
        assert!(entry.policy.is_some(), "last good kept");
        assert!(entry.error.as_deref().unwrap().contains("invalid CIDR address: 1.2.3./32"));
    }
}
