//! The API: wire types of the custom resources, the embedded CRDs, the schema validator
//! and the parser that turns one YAML/JSON document into a typed object.

pub mod crds;
pub mod meta;
pub mod parse;
pub mod schema;
pub mod types;

pub use parse::{Object, ParseError, parse_document};

/// The kinds egressd reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    /// k8s.ovn.org/v1 EgressFirewall (namespaced).
    EgressFirewall,
    /// k8s.ovn.org/v1 EgressIP (cluster-scoped).
    EgressIP,
    /// k8s.ovn.org/v1 EgressQoS (namespaced).
    EgressQoS,
    /// cloud.network.openshift.io/v1 CloudPrivateIPConfig (cluster-scoped).
    CloudPrivateIPConfig,
    /// v1 Namespace.
    Namespace,
    /// v1 Pod.
    Pod,
    /// v1 Node.
    Node,
}

impl Kind {
    /// The dynamic API resource (group, version, kind, plural) of this kind.
    pub fn api_resource(self) -> kube_core::ApiResource {
        let gvk = kube_core::GroupVersionKind::gvk(self.group(), "v1", self.as_str());
        kube_core::ApiResource::from_gvk_with_plural(&gvk, self.plural())
    }

    /// The kind's name as in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::EgressFirewall => "EgressFirewall",
            Kind::EgressIP => "EgressIP",
            Kind::EgressQoS => "EgressQoS",
            Kind::CloudPrivateIPConfig => "CloudPrivateIPConfig",
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::Node => "Node",
        }
    }

    /// The API group ("" for core).
    pub fn group(self) -> &'static str {
        match self {
            Kind::EgressFirewall | Kind::EgressIP | Kind::EgressQoS => "k8s.ovn.org",
            Kind::CloudPrivateIPConfig => "cloud.network.openshift.io",
            Kind::Namespace | Kind::Pod | Kind::Node => "",
        }
    }

    /// The `apiVersion` egressd reads.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::EgressFirewall | Kind::EgressIP | Kind::EgressQoS => "k8s.ovn.org/v1",
            Kind::CloudPrivateIPConfig => "cloud.network.openshift.io/v1",
            Kind::Namespace | Kind::Pod | Kind::Node => "v1",
        }
    }

    /// The resource's plural name.
    pub(crate) fn plural(self) -> &'static str {
        match self {
            Kind::EgressFirewall => "egressfirewalls",
            Kind::EgressIP => "egressips",
            Kind::EgressQoS => "egressqoses",
            Kind::CloudPrivateIPConfig => "cloudprivateipconfigs",
            Kind::Namespace => "namespaces",
            Kind::Pod => "pods",
            Kind::Node => "nodes",
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(self, Kind::EgressFirewall | Kind::EgressQoS | Kind::Pod)
    }

    /// Whether this is one of the four custom resources (validated against a CRD).
    pub fn is_custom(self) -> bool {
        matches!(self, Kind::EgressFirewall | Kind::EgressIP | Kind::EgressQoS | Kind::CloudPrivateIPConfig)
    }

    /// Look a kind up by `apiVersion` and `kind`.
    /// Every kind egressd reads.
    pub(crate) const ALL: [Kind; 7] = [
        Kind::EgressFirewall,
        Kind::EgressIP,
        Kind::EgressQoS,
        Kind::CloudPrivateIPConfig,
        Kind::Namespace,
        Kind::Pod,
        Kind::Node,
    ];

    pub(crate) fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        Self::ALL.into_iter().find(|k| k.api_version() == api_version && k.as_str() == kind)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identity of one object: kind, namespace (empty for cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct ObjectKey {
    /// The kind.
    pub kind: Kind,
    /// The namespace, empty for cluster-scoped kinds.
    pub namespace: Name,
    /// The name.
    pub name: Name,
}

/// A namespace or object name: inline up to 24 bytes (Kubernetes names mostly are), so
/// copying a key — every status of every compile carries one — allocates nothing.
pub type Name = compact_str::CompactString;

impl ObjectKey {
    /// A key for a namespaced or cluster-scoped object.
    pub fn new(kind: Kind, namespace: impl Into<Name>, name: impl Into<Name>) -> Self {
        Self { kind, namespace: namespace.into(), name: name.into() }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}
