//! The watches: one per kind (custom resources as dynamic objects, Nodes and Namespaces
//! as metadata, Pods reduced as they arrive), each message tagged with its watch's
//! generation; and the pod watch, whose scope follows what the node needs.

use super::*;

pub(super) fn key_of(kind: Kind, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    let ns = if kind.namespaced() { meta.namespace.clone().unwrap_or_default() } else { String::new() };
    ObjectKey::new(kind, ns, meta.name.clone().unwrap_or_default())
}

pub(super) fn custom(kind: Kind, obj: DynamicObject) -> KubeMsg {
    let key = key_of(kind, &obj.metadata);
    let mut value = match serde_json::to_value(&obj) {
        Ok(v) => v,
        Err(e) => return KubeMsg::Apply { key, object: Err(format!("cannot encode: {e}")), observed: None },
    };
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), Value::String(kind.api_version().into()));
        map.insert("kind".into(), Value::String(kind.as_str().into()));
    }
    let managed = obj.metadata.managed_fields.iter().flatten();
    let observed = observe(
        obj.metadata.uid.clone(),
        value.get("status"),
        managed.filter_map(|m| Some((m.manager.as_deref()?, &m.fields_v1.as_ref()?.0))),
        crate::status::LEADER_MANAGER,
    );
    let object = match parse_document(&value, "", false) {
        Ok(Parsed::Object(o)) => Ok(Box::new(o)),
        Ok(Parsed::Ignored { kind, .. }) => Err(format!("unexpected kind {kind}")),
        Err(e) => Err(e.violations.join("; ")),
    };
    KubeMsg::Apply { key, object, observed: Some(observed) }
}

/// Objects per page of a custom resource's list. A page is held whole while its objects
/// are handed on, each as a JSON tree (`DynamicObject`): 500 (kube-runtime's default)
/// EgressFirewalls of 100 rules made the agent's peak ~100 MiB of JSON trees at start
/// (heaptrack, bench/FINDINGS.md "peak RSS").
pub(super) const CUSTOM_PAGE: u32 = 25;

/// A message with the generation of the watch that sent it (0 for every kind but Pod,
/// whose watch is replaced when its scope changes).
pub(super) type Tagged = (u64, KubeMsg);

/// Run [`forward`] as a task of its own, its logs in a `watch{kind}` span.
pub(super) fn spawn_watch<K, S, F>(
    kind: Kind,
    stream: S,
    tx: (u64, mpsc::Sender<Tagged>),
    convert: F,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Send + 'static,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    F: Fn(K) -> KubeMsg + Send + 'static,
{
    let span = tracing::info_span!("watch", kind = %kind);
    tokio::spawn(tracing::Instrument::instrument(forward(kind, stream, tx, convert), span))
}

/// The watch of `api` (with the default backoff).
pub(super) fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures::Stream<Item = Result<Event<K>, watcher::Error>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, config).default_backoff()
}

pub(super) async fn forward<K, S, F>(kind: Kind, stream: S, tx: (u64, mpsc::Sender<Tagged>), convert: F)
where
    K: kube::Resource,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>>,
    F: Fn(K) -> KubeMsg,
{
    let (generation, tx) = tx;
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let msg = match event {
            Ok(Event::Init) => KubeMsg::Init(kind),
            Ok(Event::InitDone) => KubeMsg::InitDone(kind),
            Ok(Event::Apply(o) | Event::InitApply(o)) => convert(o),
            Ok(Event::Delete(o)) => KubeMsg::Delete(key_of(kind, o.meta())),
            Err(e) => KubeMsg::Error(kind, WatchProblem::of(&e), e.to_string()),
        };
        if tx.send((generation, msg)).await.is_err() {
            return;
        }
    }
}

/// Start one watcher task per kind but Pod (see [`PodWatch`]); messages go to `tx`.
/// Namespaces are watched as metadata only (labels and annotations are all egressd
/// reads of them).
pub(super) fn start_watches(client: &Client, tx: &mpsc::Sender<Tagged>) {
    let config = watcher::Config::default;
    let namespaces = watch(Api::<PartialObjectMeta<Namespace>>::all(client.clone()), config());
    spawn_watch(Kind::Namespace, namespaces, (0, tx.clone()), |o| KubeMsg::Apply {
        key: key_of(Kind::Namespace, &o.metadata),
        object: Ok(Box::new(Object::Namespace(Namespace { metadata: o.metadata, ..Namespace::default() }))),
        observed: None,
    });
    spawn_watch(Kind::Node, watch(Api::<Node>::all(client.clone()), config()), (0, tx.clone()), |o| KubeMsg::Apply {
        key: key_of(Kind::Node, &o.metadata),
        object: Ok(Box::new(Object::Node(o))),
        observed: None,
    });
    for kind in [Kind::EgressFirewall, Kind::EgressQoS, Kind::EgressIP, Kind::CloudPrivateIPConfig] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.api_resource());
        spawn_watch(kind, watch(api, config().page_size(CUSTOM_PAGE)), (0, tx.clone()), move |o| custom(kind, o));
    }
}

/// Which pods an agent's view holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodScope {
    /// Every scheduled pod of the cluster (`egressd explain --kubeconfig`, which answers
    /// for any pod).
    Cluster,
    /// This node's pods, and every scheduled pod only while [`ClusterView::needs_cluster_pods`].
    Node(String),
}

/// The field selector of the pod watch: the node's own pods, or every scheduled one.
/// Unscheduled pods have no address and matter to no node.
pub(super) fn pod_selector(node: Option<&str>) -> String {
    match node {
        Some(n) => format!("spec.nodeName={n}"),
        None => "spec.nodeName!=".into(),
    }
}

/// The pod watch's configuration for `node`'s pods, or every scheduled pod (`None`).
///
/// A node's own pods are listed from the API server's watch cache (`resourceVersion=0`,
/// as the kubelet lists them), in one answer: kube-core sends `resourceVersion=0` only
/// when the list has no `limit`, and a field-selected list without it is read from etcd,
/// every pod of the cluster decoded to find the node's ~100 — 55 s at 150,000 pods with
/// 10 agents starting, over the API server's 60 s timeout with 50 (bench/FINDINGS.md
/// "2026-11-27 (seventh)"). Every scheduled pod is listed in pages from etcd instead:
/// one answer from the cache would be the whole cluster at once.
pub(super) fn pod_config(node: Option<&str>) -> watcher::Config {
    let config = watcher::Config::default().fields(&pod_selector(node));
    if node.is_none() {
        return config;
    }
    let mut config = config.any_semantic();
    config.page_size = None;
    config
}

/// The pod watch, replaced when its scope changes.
pub(super) struct PodWatch {
    /// Whose pods (`None`: every pod, always).
    pub(super) node: Option<String>,
    /// The running watch covers every scheduled pod.
    pub(super) wide: bool,
    /// The running watch's generation: messages of older ones are dropped.
    pub(super) generation: u64,
    /// The running watch's list is complete.
    pub(super) listed: bool,
    pub(super) task: Option<tokio::task::JoinHandle<()>>,
    /// What starts a watch (none in unit tests).
    pub(super) start: Option<(Client, mpsc::Sender<Tagged>)>,
    /// How long the wide watch is kept once the node no longer needs it.
    pub(super) hold: std::time::Duration,
    /// When the wide watch narrows (set while it is no longer needed).
    pub(super) narrow_at: Option<tokio::time::Instant>,
}

/// How long a node keeps following every pod after it stopped needing them
/// ([`PodWatch::hold`]): re-listing the cluster's pods costs the API server and the node
/// seconds at 150,000 pods (2.2 s for the first EgressIP, 0.8–1.0 s each time one was
/// created again after the last was deleted: bench/FINDINGS.md "2026-11-27 (seventh)"),
/// so an EgressIP deleted and created again, or a host that loses and regains an egress
/// IP, does not pay it twice.
pub const NARROW_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

impl PodWatch {
    /// Replace the running watch by one covering every pod (`wide`) or the node's own.
    pub(super) fn restart(&mut self, wide: bool) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.generation += 1;
        self.wide = wide;
        self.listed = false;
        let Some((client, tx)) = &self.start else { return };
        let config = pod_config(if wide { None } else { self.node.as_deref() });
        tracing::info!(selector = config.field_selector.as_deref().unwrap_or_default(), "watching pods");
        self.task = Some(spawn_watch(
            Kind::Pod,
            watch(Api::<Pod>::all(client.clone()), config),
            (self.generation, tx.clone()),
            |o| KubeMsg::Apply {
                key: key_of(Kind::Pod, &o.metadata),
                object: Ok(Box::new(Object::Pod(o))),
                observed: None,
            },
        ));
    }

    /// Whether `msg` comes from the running pod watch (or is not about pods).
    pub(super) fn current(&mut self, generation: u64, msg: &KubeMsg) -> bool {
        if msg.kind() != Kind::Pod {
            return true;
        }
        if generation != self.generation {
            return false;
        }
        if matches!(msg, KubeMsg::InitDone(_)) {
            self.listed = true;
        }
        true
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
