//! Per-object status on one node: what happened, typed ([`ObjectStatus`]), and its
//! rendering to the reference's wording — here and nowhere else. The status writer
//! writes [`ObjectStatus::message`] and [`ObjectStatus::condition`]; the leader reads the
//! other nodes' entries back with [`parse_message`] and [`condition_node`]; the agent
//! records kernel failures with [`ObjectStatus::fail`].

use crate::api::{Kind, ObjectKey};

/// `status.status` and a node's message when its EgressFirewall rules are in place.
pub const FIREWALL_APPLIED: &str = "EgressFirewall Rules applied";
/// ... when they are not (followed by `: <reason>` in a node's message).
pub const FIREWALL_NOT_APPLIED: &str = "EgressFirewall Rules not correctly applied";
/// `status.status` and the condition message when a node's EgressQoS rules are in place.
pub const QOS_APPLIED: &str = "EgressQoS Rules applied";
/// ... when they are not.
pub const QOS_NOT_APPLIED: &str = "EgressQoS Rules not correctly applied";
/// The prefix of a node's EgressQoS condition type.
pub const QOS_CONDITION_PREFIX: &str = "Ready-In-Zone-";

/// The outcome for one object on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Compiled into the desired state (and applied, unless the kernel says otherwise).
    Applied,
    /// Not (fully) applied; the reason names the field.
    Failed(String),
    /// Valid, but not acted on (name other than `default`); the reason says why.
    Ignored(String),
    /// Valid; this version of egressd does not act on this kind yet.
    Validated,
}

/// A status condition as the reference writes it (EgressQoS `Ready-In-Zone-<node>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCondition {
    /// `type`.
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// `SetupSucceeded` / `SetupFailed`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// The status of one object on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStatus {
    /// The object.
    pub key: ObjectKey,
    /// The node reporting (shared: every status of a compile names the same node, and
    /// statuses are copied at every compile).
    pub node: std::sync::Arc<str>,
    /// What happened.
    pub outcome: Outcome,
    /// Values read in the reference's restrictive way (shown after an applied message).
    pub warnings: Vec<String>,
    /// What the node does with it (EgressIP: addresses hosted, pods SNATed or steered).
    pub detail: Option<String>,
    /// The failure is the cluster's, not this node's (an EgressIP whose IPs are not all
    /// placed): every node reports it, but none records an Event for it.
    pub cluster_only: bool,
    /// The outcome before this node's own problems (kernel errors, [`Self::fail`]) were
    /// added; `None` when there were none. What every node computes alike is this
    /// outcome: the status writer's leader reports it for every node, and a node writes
    /// its own entry only while it has a problem of its own.
    pub before_local: Option<Outcome>,
}

impl ObjectStatus {
    /// The status of `key` on `node`.
    pub fn new(key: ObjectKey, node: &str, outcome: Outcome) -> Self {
        Self {
            key,
            node: node.into(),
            outcome,
            warnings: Vec::new(),
            detail: None,
            cluster_only: false,
            before_local: None,
        }
    }

    /// With warnings.
    pub(crate) fn with_warnings(mut self, warnings: Vec<String>) -> Self {
        self.warnings = warnings;
        self
    }

    /// With a detail.
    pub(crate) fn with_detail(mut self, detail: String) -> Self {
        self.detail = Some(detail);
        self
    }

    /// Record a problem found after compiling (a kernel error): an applied object is
    /// failed now, a failed one gets one more reason; ignored and validated ones are not
    /// in the dataplane and stay as they are.
    pub fn fail(&mut self, problem: &str) {
        self.cluster_only = false;
        if matches!(self.outcome, Outcome::Applied | Outcome::Failed(_)) && self.before_local.is_none() {
            self.before_local = Some(self.outcome.clone());
        }
        match &mut self.outcome {
            Outcome::Applied => self.outcome = Outcome::Failed(problem.to_string()),
            Outcome::Failed(reason) => {
                reason.push_str("; ");
                reason.push_str(problem);
            }
            Outcome::Ignored(_) | Outcome::Validated => {}
        }
    }

    /// This node has a problem of its own with the object (a kernel error).
    pub fn local_problem(&self) -> bool {
        self.before_local.is_some()
    }

    /// The status every node computes alike (without this node's own problems), as
    /// `node` would report it.
    pub fn as_on(&self, node: &str) -> ObjectStatus {
        let outcome = self.before_local.clone().unwrap_or_else(|| self.outcome.clone());
        ObjectStatus { node: node.into(), outcome, before_local: None, ..self.clone() }
    }

    /// The message in the reference's wording, as it is written to the object (and
    /// shown by `egressd status`).
    pub fn message(&self) -> String {
        let node = &self.node;
        if let Outcome::Ignored(reason) = &self.outcome {
            return reason.clone();
        }
        match (self.key.kind, &self.outcome) {
            (Kind::EgressFirewall, Outcome::Applied) => {
                let mut extra: Vec<String> = self.detail.iter().cloned().collect();
                if !self.warnings.is_empty() {
                    extra.push(format!("warning: {}", self.warnings.join("; ")));
                }
                if extra.is_empty() {
                    format!("{node}: {FIREWALL_APPLIED}")
                } else {
                    format!("{node}: {FIREWALL_APPLIED} ({})", extra.join("; "))
                }
            }
            (Kind::EgressFirewall, Outcome::Failed(r)) => format!("{node}: {FIREWALL_NOT_APPLIED}: {r}"),
            (Kind::EgressQoS, _) => match self.condition() {
                Some(c) => format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message),
                None => String::new(),
            },
            (Kind::EgressIP, Outcome::Applied) => {
                format!("{node}: EgressIP applied: {}", self.detail.as_deref().unwrap_or_default())
            }
            (Kind::EgressIP, Outcome::Failed(r)) => match &self.detail {
                Some(d) => format!("{node}: EgressIP not fully applied: {r}; {d}"),
                None => format!("{node}: {r}"),
            },
            (kind, Outcome::Validated) => format!("{node}: valid; {kind} is not enforced by this version"),
            (_, Outcome::Failed(r)) => format!("{node}: {r}"),
            (_, _) => match &self.detail {
                Some(d) => format!("{node}: applied: {d}"),
                None => format!("{node}: applied"),
            },
        }
    }

    /// The condition this node writes, for kinds that report conditions (EgressQoS).
    pub fn condition(&self) -> Option<StatusCondition> {
        if self.key.kind != Kind::EgressQoS {
            return None;
        }
        let type_ = format!("{QOS_CONDITION_PREFIX}{}", self.node);
        match &self.outcome {
            Outcome::Applied => Some(StatusCondition {
                type_,
                status: "True".into(),
                reason: "SetupSucceeded".into(),
                message: QOS_APPLIED.into(),
            }),
            Outcome::Failed(e) => Some(StatusCondition {
                type_,
                status: "False".into(),
                reason: "SetupFailed".into(),
                message: format!("{QOS_NOT_APPLIED}: {e}"),
            }),
            Outcome::Ignored(_) | Outcome::Validated => None,
        }
    }

    /// One word for the outcome (`egressd status`).
    pub fn state(&self) -> &'static str {
        match &self.outcome {
            Outcome::Applied => "applied",
            Outcome::Failed(_) => "failed",
            Outcome::Ignored(_) => "ignored",
            Outcome::Validated => "validated",
        }
    }
}

/// A node's EgressFirewall message read back: (node, applied).
pub fn parse_message(message: &str) -> Option<(&str, bool)> {
    let (node, rest) = message.split_once(": ")?;
    if rest.starts_with(FIREWALL_NOT_APPLIED) {
        Some((node, false))
    } else if rest.starts_with(FIREWALL_APPLIED) {
        Some((node, true))
    } else {
        None
    }
}

/// The node of an EgressQoS condition type.
pub fn condition_node(type_: &str) -> Option<&str> {
    type_.strip_prefix(QOS_CONDITION_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_renders_in_the_reference_wording_and_reads_back() {
        let ef = ObjectKey::new(Kind::EgressFirewall, "a", "default");
        let mut s = ObjectStatus::new(ef.clone(), "n1", Outcome::Applied);
        assert_eq!(s.message(), "n1: EgressFirewall Rules applied");
        assert_eq!(parse_message(&s.message()), Some(("n1", true)));
        s.fail("kernel error: x");
        assert_eq!(s.message(), "n1: EgressFirewall Rules not correctly applied: kernel error: x");
        assert_eq!(parse_message(&s.message()), Some(("n1", false)));
        s.fail("y");
        assert_eq!(s.outcome, Outcome::Failed("kernel error: x; y".into()));
        let warned = ObjectStatus::new(ef, "n1", Outcome::Applied).with_warnings(vec!["w".into()]);
        assert_eq!(warned.message(), "n1: EgressFirewall Rules applied (warning: w)");
        assert_eq!(parse_message(&warned.message()), Some(("n1", true)));
        assert_eq!(parse_message("garbage"), None);

        let qos =
            ObjectStatus::new(ObjectKey::new(Kind::EgressQoS, "a", "default"), "n1", Outcome::Failed("bad".into()));
        let c = qos.condition().unwrap();
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Ready-In-Zone-n1", "False", "SetupFailed")
        );
        assert_eq!(qos.message(), "Ready-In-Zone-n1=False SetupFailed: EgressQoS Rules not correctly applied: bad");
        assert_eq!(condition_node(&c.type_), Some("n1"));

        let eip = ObjectKey::new(Kind::EgressIP, "", "e");
        let applied =
            ObjectStatus::new(eip.clone(), "n1", Outcome::Applied).with_detail("hosts 198.19.0.50 on eth0".into());
        assert_eq!(applied.message(), "n1: EgressIP applied: hosts 198.19.0.50 on eth0");
        let mut failed = applied.clone();
        failed.fail("kernel error: z");
        assert_eq!(failed.message(), "n1: EgressIP not fully applied: kernel error: z; hosts 198.19.0.50 on eth0");
        let invalid = ObjectStatus::new(eip, "n1", Outcome::Failed("spec.egressIPs[0]: bad".into()));
        assert_eq!(invalid.message(), "n1: spec.egressIPs[0]: bad");

        let cloud = ObjectKey::new(Kind::CloudPrivateIPConfig, "", "198.19.0.50");
        let v = ObjectStatus::new(cloud, "n1", Outcome::Validated);
        assert_eq!(v.message(), "n1: valid; CloudPrivateIPConfig is not enforced by this version");
        let mut ignored = ObjectStatus::new(
            ObjectKey::new(Kind::EgressFirewall, "a", "x"),
            "n1",
            Outcome::Ignored("only default".into()),
        );
        ignored.fail("kernel");
        assert_eq!(ignored.message(), "only default");
    }

    #[test]
    fn a_nodes_own_problem_is_kept_apart_from_what_every_node_computes() {
        let ef = ObjectKey::new(Kind::EgressFirewall, "a", "default");
        let mut s = ObjectStatus::new(ef.clone(), "n1", Outcome::Failed("spec.egress[0]: bad".into()));
        assert!(!s.local_problem());
        assert_eq!(s.as_on("n2").message(), "n2: EgressFirewall Rules not correctly applied: spec.egress[0]: bad");
        s.fail("kernel error: x");
        s.fail("kernel error: y");
        assert!(s.local_problem());
        assert_eq!(
            s.message(),
            "n1: EgressFirewall Rules not correctly applied: spec.egress[0]: bad; kernel error: x; kernel error: y"
        );
        let other = s.as_on("n2");
        assert_eq!(other.message(), "n2: EgressFirewall Rules not correctly applied: spec.egress[0]: bad");
        assert!(!other.local_problem());
        let mut ignored = ObjectStatus::new(ef, "n1", Outcome::Ignored("only default".into()));
        ignored.fail("kernel");
        assert!(!ignored.local_problem(), "an ignored object is not in the dataplane");
    }
}
