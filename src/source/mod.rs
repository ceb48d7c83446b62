//! Where objects come from. Every source fills the same [`crate::view::ClusterView`]; the
//! compile step does not know which one it was.
//!
//! * [`manifests`]: a directory of YAML files (the embedded default: demos, tests,
//!   static hosts), watched for changes.

pub mod kube;
pub mod manifests;
